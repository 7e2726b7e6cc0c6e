"""flash's Gluon kernels (kernels/methods/flash/fwd_gluon.py, plan ``FwdPlan.gluon``; the backward's dk/dv
and dq passes, bwd_gluon.py, plan ``BwdPlan.gluon``): their plans' limits, where they stand aside (an explicit plan
refuses with the reason; a table plan falls back to the Triton kernels), their compile for sm_90 without
a GPU (warp-specialized, TMA loads, wgmma, the barrier protocol, no spill), and on a Hopper GPU their
outputs against float64 and, element by element, against the Triton kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import bwd_gluon, fwd_gluon
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from tests.test_flash_attention import make_qkv, run_and_compare

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GLUON = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=2)
GLUON_BWD = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, gluon=1)
GLUON_BWD2 = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, block_m2=128, block_n2=64, dq_stages=2, gluon=2)


def test_gluon_plan_limits():
    assert plans.FwdPlan(block_m=128, block_n=64, num_stages=3, gluon=1).gluon
    for bad in (dict(block_m=64), dict(block_n=32), dict(block_n=256), dict(num_stages=1)):
        with pytest.raises(ValueError, match="gluon=2"):
            dataclasses.replace(GLUON, **bad)
    with pytest.raises(ValueError, match="0 .the Triton kernel., 1 .Gluon. or 2"):
        dataclasses.replace(GLUON, gluon=3)
    assert fwd_gluon.shared_bytes(128, 128, 3) <= fwd_gluon.SHARED_LIMIT < fwd_gluon.shared_bytes(128, 128, 4)
    # the Triton kernel's blocks shrink to short sequences; the Gluon kernel's tiles stay
    f, _ = plans.clamp(GLUON, plans.BwdPlan(), 5, 7)
    assert (f.block_m, f.block_n) == (128, 128)


def test_gluon_backward_plan_limits():
    assert dataclasses.replace(GLUON_BWD, block_m1=32, num_stages=3).gluon
    for bad in (dict(block_n1=64), dict(block_m1=128), dict(num_stages=1), dict(fused=True), dict(dq_mode="atomic"),
                dict(gluon=2)):
        with pytest.raises(ValueError, match="gluon"):
            dataclasses.replace(GLUON_BWD, **bad)
    for bad in (dict(block_m2=64), dict(block_n2=32), dict(dq_stages=1)):
        with pytest.raises(ValueError, match="gluon=2"):
            dataclasses.replace(GLUON_BWD2, **bad)
    _, b = plans.clamp(plans.FwdPlan(), GLUON_BWD, 5, 7)  # the Gluon tiles stay; the Triton dq pass's shrink
    assert (b.block_n1, b.block_m1, b.block_m2, b.block_n2) == (128, 64, 16, 16)
    _, b = plans.clamp(plans.FwdPlan(), GLUON_BWD2, 5, 7)
    assert (b.block_n1, b.block_m1, b.block_m2, b.block_n2) == (128, 64, 128, 64)
    assert bwd_gluon.shared_bytes(128, 128, 2) <= fwd_gluon.SHARED_LIMIT < bwd_gluon.shared_bytes(128, 128, 3)
    assert bwd_gluon.budget_reason(128, GLUON_BWD2) is None
    assert "dq kernel" in bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD2, block_n2=128, dq_stages=3))
    assert "dk/dv kernel" in bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD2, num_stages=6))
    assert fwd_gluon.budget_reason(128, 128, 3) is None and "shared memory" in fwd_gluon.budget_reason(128, 128, 4)
    assert bwd_gluon.shared_bytes(128, 64, 5) <= fwd_gluon.SHARED_LIMIT < bwd_gluon.shared_bytes(128, 64, 6)


def test_where_it_cannot_run_an_explicit_plan_refuses_and_a_table_plan_falls_back(monkeypatch):
    if DEVICE == "cuda" and fwd_gluon.supported(*make_qkv(1, 1, 8, 8, 64, torch.bfloat16)) is None:
        pytest.skip("the Gluon forward runs here")
    q, k, v = (t.detach() for t in make_qkv(1, 2, 37, 37, 64, torch.bfloat16))
    why = fwd_gluon.supported(q, k, v)
    assert why
    with pytest.raises(ValueError, match="cannot run here"):
        launch_fwd(q, k, v, 0.125, True, GLUON)
    out, lse = launch_fwd(q, k, v, 0.125, True)
    for bp in (GLUON_BWD, GLUON_BWD2):
        with pytest.raises(ValueError, match="cannot run here"):
            launch_bwd(torch.ones_like(out), q, k, v, out, lse, 0.125, True, bp)
    key = (64, "bfloat16", True)
    monkeypatch.setitem(plans.TABLE, key, ((1 << 30, GLUON, GLUON_BWD2),))
    plans.forget()
    try:
        fp, bp = plans.plans_for(64, 64, torch.bfloat16, True, 37, 37)
        assert fp.gluon and bp.gluon
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = kernels.attention(qg, kg, vg, causal=True, method="flash")  # (the table's plans: no override)
        do = torch.randn_like(out)
        out.backward(do)
        ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
        ref = kernels.reference_attention(*ref_in, causal=True)
        ref.backward(do.double())
        assert kernels.relative_error(out, ref) <= kernels.ATTN_FWD_TOL[torch.bfloat16]
        for got, want in zip((qg, kg, vg), ref_in):
            assert kernels.relative_error(got.grad, want.grad) <= kernels.ATTN_BWD_TOL[torch.bfloat16]
    finally:
        monkeypatch.undo()
        plans.forget()


_NO_GLUON = r"""
import builtins, os
os.environ["TRITON_INTERPRET"] = "1"
real = builtins.__import__
def without_hopper_gluon(name, *a, **k):
    if name in ("triton.experimental.gluon.language.nvidia.hopper", "triton.experimental.gluon.nvidia.hopper"):
        raise ImportError("no Gluon Hopper module here")
    return real(name, *a, **k)
builtins.__import__ = without_hopper_gluon
import torch, kernels
from kernels.methods.flash import fwd_gluon
q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
print(fwd_gluon.GLUON_ERROR)
print(fwd_gluon.supported(q, q, q))
print("flash" in kernels.runnable_methods(op="attention"))
"""


def test_flash_imports_and_says_why_where_triton_has_no_gluon_hopper_module():
    from tests.compiled_report import compile_run

    run = compile_run(["-c", _NO_GLUON], timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    error, why, runnable = run.stdout.strip().splitlines()[-3:]
    assert "no Gluon Hopper module" in error and why == error and runnable == "True"


def test_reasons_name_what_is_not_taken():
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q, k, v = (t.detach() for t in make_qkv(1, 1, 8, 8, 64, torch.bfloat16))
    assert "GPU" in fwd_gluon.supported(q, k, v) or DEVICE == "cuda"


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import fwd_gluon as G

for case in sys.argv[1:]:
    D, BN, STAGES, causal, pingpong = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"sod": 1, "BLOCK_M": 64, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "PINGPONG": bool(pingpong)}
    sig = {"desc_q": desc(64), "desc_k": desc(BN), "desc_v": desc(BN), "O": "*bf16", "LSE": "*fp32", "sob": "i32",
           "soh": "i32", "som": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32",
           **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._fwd_ws_kernel, signature=sig, constexprs=const,
                         attrs={(3,): [["tt.divisibility", 16]], (4,): [["tt.divisibility", 16]]})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k)}))
"""


def _check_compiled(k: dict, case: str, expects: set, budget: int) -> None:
    """What every Gluon flash kernel compiled for sm_90 must show: 4-D TMA loads, wgmma, the consumers'
    240 registers (setmaxnreg), barriers that expect exactly `expects` bytes (the fixed tiles; a ring
    slot's tiles), every release one elected thread's arrive right after its warpgroup's bar.sync, its
    buffers (`budget` bytes, 1 KB of it scratch) within the H200's shared memory, no spill."""
    import re

    ptx = k["ptx"]
    assert "cp.async.bulk.tensor.4d" in ptx and "wgmma.mma_async" in ptx, case
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240", ptx), case
    expect_tx = r"mbarrier\.arrive\.expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], (\d+);"
    assert {int(n) for n in re.findall(expect_tx, ptx)} == expects, case
    arrives = re.findall(r"^\s*(@%p\d+ )?mbarrier\.arrive\.shared(?:::cta)?\.b64.*$", ptx, re.M)
    assert arrives and all(a for a in arrives), (case, arrives)  # each predicated: one thread arrives
    _assert_released_after_the_warpgroup(ptx, case)
    assert budget - 1024 <= k["shared"] <= fwd_gluon.SHARED_LIMIT, case
    assert "ld.local" not in ptx and "st.local" not in ptx, case
    if k["usage"]:
        assert "LOCAL:0" in k["usage"] and "STACK:0" in k["usage"], (case, k["usage"])


def _assert_released_after_the_warpgroup(ptx: str, case: str) -> None:
    """Each slot release (one thread's mbarrier.arrive) comes right after a barrier of its 128 threads, so
    every warp of the consumer has passed its wgmma wait before the slot is handed back."""
    import re

    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith(("//", ".loc"))]
    for i, ln in enumerate(lines):
        if re.match(r"(@%p\d+ )?mbarrier\.arrive\.shared(?:::cta)?\.b64", ln):
            before = lines[max(0, i - 4):i]
            assert any(re.match(r"bar\.sync\s+\d+,\s*128;", b) for b in before), (case, before, ln)


def test_gluon_forward_compiles_for_sm90_warp_specialized():
    """Compiled for Hopper without a GPU (tests.compiled_report: a subprocess without TRITON_INTERPRET, the
    Triton of HARNESS_COMPILE_PYTHON where set), ping-pong and free-running, both head dims and tiles:
    TMA loads of 4-D boxes whose barrier expects exactly a q tile's bytes and a k plus v tile's, wgmma,
    the consumers' 240 registers set (setmaxnreg), every barrier release by one elected thread (the
    slots' barriers count 2 arrivals, one per consumer), no spill, and the buffers within the H200's
    shared memory."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,128,3,1,1", "128,128,2,0,1", "128,64,3,1,0"]
    for case, k in zip(cases, compile_cases(_COMPILE, cases, timeout=900)):
        d, block_n, stages, _, _ = (int(a) for a in case.split(","))
        _check_compiled(k, case, {64 * d * 2, 2 * block_n * d * 2}, fwd_gluon.shared_bytes(d, block_n, stages))


_COMPILE_BWD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import bwd_gluon as G

for case in sys.argv[1:]:
    D, BM, STAGES, causal = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"s_dkd": 1, "s_dvd": 1, "BLOCK_N": 64, "BLOCK_M": BM, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal)}
    sig = {"desc_k": desc(64), "desc_v": desc(64), "desc_q": desc(BM), "desc_do": desc(BM), "LSE": "*fp32",
           "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16", "s_dkb": "i32", "s_dkh": "i32", "s_dkn": "i32",
           "s_dvb": "i32", "s_dvh": "i32", "s_dvn": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32",
           "scale": "fp32", **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._dkdv_ws_kernel, signature=sig, constexprs=const,
                         attrs={(i,): [["tt.divisibility", 16]] for i in (4, 5, 6, 7)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k)}))
"""


def test_gluon_dkdv_compiles_for_sm90_warp_specialized():
    """The Gluon dk/dv pass compiled for Hopper as the forward is (see above): per query tile the barrier
    expects a q and a do tile's bytes, each consumer's k and v once; one elected arrive per release; the
    consumers' 240 registers; no spill at the plans the tests take (d = 64 with 64-query tiles, d = 128
    with 32)."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,32,3,1", "128,32,3,0", "128,32,2,1"]  # (q + do and k + v tiles of different sizes)
    for case, k in zip(cases, compile_cases(_COMPILE_BWD, cases, timeout=900)):
        d, block_m, stages, _ = (int(a) for a in case.split(","))  # k and v; q and do
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2}, bwd_gluon.shared_bytes(d, block_m, stages))


_COMPILE_DQ = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import bwd_gluon as G

for case in sys.argv[1:]:
    D, BN, STAGES, causal = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"s_dqd": 1, "BLOCK_M": 64, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal)}
    sig = {"desc_q": desc(64), "desc_do": desc(64), "desc_k": desc(BN), "desc_v": desc(BN), "LSE": "*fp32",
           "DELTA": "*fp32", "DQ": "*bf16", "s_dqb": "i32", "s_dqh": "i32", "s_dqm": "i32", "H": "i32", "TQ": "i32",
           "TK": "i32", "qk_scale": "fp32", "scale": "fp32", **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._dq_ws_kernel, signature=sig, constexprs=const,
                         attrs={(i,): [["tt.divisibility", 16]] for i in (4, 5, 6)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k)}))
"""


def test_gluon_dq_compiles_for_sm90_warp_specialized():
    """The Gluon dq pass compiled for Hopper as the others: per key tile the barrier expects a k and a v
    tile's bytes, each consumer's q and do once; one elected arrive per release; 240 registers; no spill."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,128,2,1", "128,64,3,0", "128,128,2,1"]
    for case, k in zip(cases, compile_cases(_COMPILE_DQ, cases, timeout=900)):
        d, block_n, stages, _ = (int(a) for a in case.split(","))  # q and do; k and v
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_n * d * 2}, bwd_gluon.shared_bytes(d, block_n, stages))


# -- on a Hopper GPU ---------------------------------------------------------------------------------
_GPU_CASES = [  # (B, H, Tq, Tk, d, dtype, causal, layout, scale)
    (2, 3, 300, 300, 64, torch.bfloat16, True, "bthd", None),  # ragged T, the model's layout
    (1, 2, 1000, 1000, 128, torch.bfloat16, False, "bhtd", None),
    (2, 2, 256, 256, 64, torch.float16, True, "qkv", None),  # one fused projection's slices
    (1, 2, 100, 333, 128, torch.bfloat16, True, "bhtd", None),  # Tq < Tk
    (1, 2, 100, 333, 64, torch.bfloat16, False, "bhtd", None),
    (1, 2, 333, 100, 64, torch.bfloat16, True, "bhtd", None),  # Tq > Tk: rows with no key
    (1, 3, 1, 500, 128, torch.bfloat16, True, "bhtd", None),  # one query (decoding): its rows past Tq idle
    (1, 1, 1, 1, 64, torch.bfloat16, True, "bhtd", None),  # T = 1
    (1, 2, 200, 200, 64, torch.float16, True, "bhtd", -0.3),  # a negative scale
    (1, 2, 150, 150, 128, torch.bfloat16, False, "bhtd", 0.0),  # scale 0: uniform rows
    (1, 4, 2048, 2048, 128, torch.float16, True, "bthd", None),
]
_GPU_PLANS = [(2, 128, 2), (2, 64, 3), (1, 128, 2)]  # (gluon, block_n, num_stages)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("gplan", _GPU_PLANS, ids=lambda p: f"gluon{p[0]}-n{p[1]}-s{p[2]}")
def test_gluon_forward_and_gradients_on_the_gpu(case, gplan, monkeypatch):
    """The Gluon forward (and the backward from its lse) against float64, and element by element against
    the Triton forward (out and lse), ping-pong and free-running, both tile widths."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    plan = plans.FwdPlan(block_m=128, block_n=gplan[1], num_stages=gplan[2], gluon=gplan[0])
    launches = []
    real = fwd_gluon.launch_fwd
    monkeypatch.setattr(fwd_gluon, "launch_fwd", lambda *a, **kw: (launches.append(kw), real(*a, **kw))[1])
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plan, None))
    assert len(launches) == 1 and launches[0]["pingpong"] == (gplan[0] == 2)  # the Gluon kernel ran
    s = d ** -0.5 if scale is None else scale
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = launch_fwd(qd, kd, vd, s, causal, plan)
    out_t, lse_t = launch_fwd(qd, kd, vd, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3  # (summation orders differ: a rounding or two)
    torch.testing.assert_close(out, out_t, atol=tol, rtol=tol)
    assert out.stride() == out_t.stride()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    fin = torch.isfinite(lse_t)
    torch.testing.assert_close(lse[fin], lse_t[fin], atol=1e-3, rtol=1e-4)
    if causal and tq > tk:
        assert (out[:, :, :tq - tk] == 0).all()


_GPU_BWD_PLANS = [(1, 64, 2, 64, 2), (1, 32, 3, 64, 2), (2, 64, 2, 128, 2), (2, 32, 3, 64, 3), (2, 32, 2, 128, 2)]
# (gluon, block_m1, num_stages, block_n2, dq_stages)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("bplan", _GPU_BWD_PLANS, ids=lambda p: f"gluon{p[0]}-m{p[1]}-s{p[2]}-n{p[3]}-s{p[4]}")
def test_gluon_backward_on_the_gpu(case, bplan, monkeypatch):
    """The Gluon dk/dv pass, with the Triton dq pass (gluon=1) or the Gluon one (2), against float64, and dq,
    dk, dv element by element against the Triton backward."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    if d == 128 and bplan[1] == 64:
        pytest.skip("d = 128 takes 32-query dk/dv tiles (64 spill 16 bytes a thread: not a plan the sweep keeps)")
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    gluon, block_m1, stages, block_n2, dq_stages = bplan
    plan = plans.BwdPlan(block_n1=128, block_m1=block_m1, num_stages=stages, gluon=gluon,
                         **(dict(block_m2=128, block_n2=block_n2, dq_stages=dq_stages) if gluon == 2 else {}))
    launches = []
    for name in ("launch_dkdv", "launch_dq"):
        real = getattr(bwd_gluon, name)
        monkeypatch.setattr(bwd_gluon, name, (lambda n, f: lambda *a: (launches.append(n), f(*a))[1])(name, real))
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plans.FwdPlan(block_m=64, block_n=64), plan))
    assert launches == ["launch_dkdv"] + (["launch_dq"] if gluon == 2 else [])  # the Gluon kernels ran
    s = d ** -0.5 if scale is None else scale
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = launch_fwd(qd, kd, vd, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    do = torch.randn_like(out)
    got = launch_bwd(do, qd, kd, vd, out, lse, s, causal, plan)
    want = launch_bwd(do, qd, kd, vd, out, lse, s, causal, plans.BwdPlan(block_m1=32, block_n1=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.stride() == w.stride(), name
        torch.testing.assert_close(g, w, atol=tol * max(1.0, w.abs().max().item()), rtol=tol, msg=name)
