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
GLUON_BWD_ADD = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, gluon=1, dq_mode="tma_add")


def test_gluon_plan_limits():
    assert plans.FwdPlan(block_m=128, block_n=64, num_stages=3, gluon=1).gluon
    for bad in (dict(block_m=64), dict(block_n=32), dict(block_n=256), dict(num_stages=1)):
        with pytest.raises(ValueError, match="gluon=2"):
            dataclasses.replace(GLUON, **bad)
    with pytest.raises(ValueError, match="0 .the Triton kernel., 1 .Gluon. or 2"):
        dataclasses.replace(GLUON, gluon=3)
    assert dataclasses.replace(GLUON, persistent=True).persistent
    with pytest.raises(ValueError, match="persistent=True. is the Gluon forward's"):
        plans.FwdPlan(persistent=True)
    assert fwd_gluon.shared_bytes(128, 128, 3) <= fwd_gluon.SHARED_LIMIT < fwd_gluon.shared_bytes(128, 128, 4)
    # persistent programs hold a second pair of q tiles (the next work tile's)
    assert fwd_gluon.shared_bytes(64, 128, 2, persistent=True) == fwd_gluon.shared_bytes(64, 128, 2) + 2 * 64 * 64 * 2
    assert fwd_gluon.budget_reason(128, 128, 3) is None
    assert "persistent" in fwd_gluon.budget_reason(128, 128, 3, persistent=True)
    # the Triton kernel's blocks shrink to short sequences; the Gluon kernel's tiles stay
    f, _ = plans.clamp(GLUON, plans.BwdPlan(), 5, 7)
    assert (f.block_m, f.block_n) == (128, 128)


def test_gluon_forward_programs_are_for_persistent_launches_only():
    """``programs`` caps the persistent programs: refused without persistent, and below 1 (before any launch)."""
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="is for persistent=True"):
        fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 128, 2, programs=3)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="an int >= 1"):
            fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 128, 2, persistent=True, programs=bad)


def test_gluon_descriptors_skip_the_checks_only_where_they_come_out_the_same(monkeypatch):
    """Descriptors of tensors the kernels take are made without the dataclass's checks once the first one
    made both ways compared equal; where they would not, every one is made the checked way."""
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q = torch.zeros(2, 40, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
    monkeypatch.setattr(fwd_gluon, "_UNCHECKED", None)
    first = fwd_gluon._descriptor(q, 64)
    assert fwd_gluon._UNCHECKED is True
    made = []
    monkeypatch.setattr(fwd_gluon, "GluonDescriptor", lambda *a: made.append(a) or first)
    again = fwd_gluon._descriptor(q[:, :, 1:], 64)  # (another view: its own shape and base)
    assert not made and again is not first and list(again.shape) == [2, 3, 39, 64] and again.base.data_ptr() != 0
    assert again.block_shape == [1, 1, 64, 64] and again.layout == first.layout
    monkeypatch.setattr(fwd_gluon, "_UNCHECKED", None)
    monkeypatch.setattr(fwd_gluon, "_unchecked", lambda *a: None)  # (a Triton whose descriptors differ)
    fwd_gluon._descriptor(q, 64)
    fwd_gluon._descriptor(q, 64)
    assert fwd_gluon._UNCHECKED is False and len(made) == 2


def test_gluon_backward_plan_limits():
    assert dataclasses.replace(GLUON_BWD, block_m1=32, num_stages=3).gluon
    for bad in (dict(block_n1=64), dict(block_m1=128), dict(num_stages=1), dict(fused=True), dict(dq_mode="atomic"),
                dict(gluon=2)):
        with pytest.raises(ValueError, match="gluon"):
            dataclasses.replace(GLUON_BWD, **bad)
    for bad in (dict(block_m2=64), dict(block_n2=32), dict(dq_stages=1)):
        with pytest.raises(ValueError, match="gluon=2"):
            dataclasses.replace(GLUON_BWD2, **bad)
    assert dataclasses.replace(GLUON_BWD_ADD, num_stages=3).dq_mode == "tma_add"
    for bad in (dict(block_m1=32), dict(gluon=2, block_m2=128, block_n2=64, dq_stages=2)):
        with pytest.raises(ValueError, match="tma_add"):  # (a warpgroup's dq tile is 64 queries; no dq pass to run)
            dataclasses.replace(GLUON_BWD_ADD, **bad)
    # dq's buffers: two tiles' ds^T of both consumers (16-bit) and each consumer's fp32 dq tile
    extra = 4 * 64 * 64 * 2 + 2 * 64 * 64 * 4
    assert bwd_gluon.shared_bytes(64, 64, 2, dq=True) == bwd_gluon.shared_bytes(64, 64, 2) + extra
    assert bwd_gluon.budget_reason(128, GLUON_BWD_ADD) is None  # (225 KB of the 227)
    assert "dk/dv kernel" in bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD_ADD, num_stages=3))
    # (under deterministic algorithms the kernel runs without dq's buffers: they do not count then)
    assert bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD_ADD, num_stages=3), add_dq=False) is None
    assert bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD, num_stages=3)) is None
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
    for bp in (GLUON_BWD, GLUON_BWD2, GLUON_BWD_ADD):
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
    D, BN, STAGES, causal, pingpong, persistent = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"sod": 1, "BLOCK_M": 64, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "PINGPONG": bool(pingpong), "Q_BUFS": 2 if persistent else 1, "LEVELS": bool(persistent and causal)}
    sig = {"desc_q": desc(64), "desc_k": desc(BN), "desc_v": desc(BN), "O": "*bf16", "LSE": "*fp32", "sob": "i32",
           "soh": "i32", "som": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32", "n_m": "i32",
           "n_bh": "i32", **{k: "constexpr" for k in const}}
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
    Triton of HARNESS_COMPILE_PYTHON where set), ping-pong and free-running, a program a work tile and
    persistent, both head dims and tiles:
    TMA loads of 4-D boxes whose barrier expects exactly a q tile's bytes and a k plus v tile's, wgmma,
    the consumers' 240 registers set (setmaxnreg), every barrier release by one elected thread (the
    slots' barriers count 2 arrivals, one per consumer), no spill, and the buffers within the H200's
    shared memory."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,128,3,1,1,0", "128,128,2,0,1,0", "128,64,3,1,0,0", "64,128,2,1,1,1", "128,64,2,1,0,1"]
    for case, k in zip(cases, compile_cases(_COMPILE, cases, timeout=900)):
        d, block_n, stages, _, _, persistent = (int(a) for a in case.split(","))
        _check_compiled(k, case, {64 * d * 2, 2 * block_n * d * 2},
                        fwd_gluon.shared_bytes(d, block_n, stages, bool(persistent)))


_COMPILE_BWD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import bwd_gluon as G

for case in sys.argv[1:]:
    D, BM, STAGES, causal, dq = (int(a) for a in case.split(","))
    lay = lambda rows, ty=gl.bfloat16: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], ty)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"s_dkd": 1, "s_dvd": 1, "BLOCK_N": 64, "BLOCK_M": BM, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "DQ": bool(dq)}
    sig = {"desc_k": desc(64), "desc_v": desc(64), "desc_q": desc(BM), "desc_do": desc(BM), "LSE": "*fp32",
           "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16", "s_dkb": "i32", "s_dkh": "i32", "s_dkn": "i32",
           "s_dvb": "i32", "s_dvh": "i32", "s_dvn": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32",
           "scale": "fp32",
           "desc_dqa": f"tensordesc<fp32[1,1,{BM},{D}],{lay(BM, gl.float32)}>" if dq else desc(64),
           **{k: "constexpr" for k in const}}
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
    cases = ["64,32,3,1,0", "128,32,3,0,0", "128,32,2,1,0"]  # (q + do and k + v tiles of different sizes)
    for case, k in zip(cases, compile_cases(_COMPILE_BWD, cases, timeout=900)):
        d, block_m, stages, _, _ = (int(a) for a in case.split(","))  # k and v; q and do
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2}, bwd_gluon.shared_bytes(d, block_m, stages))
        assert "cp.reduce.async.bulk" not in k["ptx"], case


def test_gluon_dkdv_adding_dq_compiles_for_sm90_with_ordered_reductions():
    """The dk/dv pass that adds dq (plan dq_mode="tma_add"), compiled for Hopper: the dk/dv kernel's protocol
    (above) and no spill at d = 64; each consumer's TMA reduction (a 4-D bulk tensor add, one thread) issued
    right after its warpgroup's barrier that follows the dq tile's stores and the async-proxy fence; before
    those stores, its previous reductions waited for (wait_group.read 0) and that barrier again; the ds^T
    tiles written (stmatrix) and fenced before the warpgroup's barrier and arrive that hand them over; one
    more wait for the reductions, where the consumers end."""
    import re

    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,64,2,1,1", "64,64,3,0,1"]
    for case, k in zip(cases, compile_cases(_COMPILE_BWD, cases, timeout=900)):
        d, block_m, stages, _, _ = (int(a) for a in case.split(","))
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2},
                        bwd_gluon.shared_bytes(d, block_m, stages, dq=True))
        lines = [ln.strip() for ln in k["ptx"].splitlines()
                 if ln.strip() and not ln.strip().startswith(("//", ".loc", "$", "{", "}", ".reg"))]
        reductions = [i for i, ln in enumerate(lines) if re.match(
            r"@%p\d+ cp\.reduce\.async\.bulk\.tensor\.4d\.global\.shared::cta\.(bulk_group\.)?add", ln)]
        assert len(reductions) == 2, (case, len(reductions))  # one per consumer
        for i in reductions:
            before = lines[:i]
            bar = max(j for j, ln in enumerate(before) if re.match(r"bar\.sync\s+\d+,\s*128;", ln))
            fence = max(j for j, ln in enumerate(before) if ln.startswith("fence.proxy.async"))
            store = max(j for j, ln in enumerate(before) if ln.startswith("st.shared"))
            wait = max(j for j, ln in enumerate(before) if re.match(r"cp\.async\.bulk\.wait_group\.read\s+0;", ln))
            assert wait < store < fence < bar < i, (case, wait, store, fence, bar, i)
            assert any(re.match(r"bar\.sync\s+\d+,\s*128;", ln) for ln in lines[wait + 1:wait + 3]), case
        def event(ln):
            return ("stmatrix" if ln.startswith("stmatrix") else "fence" if ln.startswith("fence.proxy.async") else
                    "bar" if re.match(r"bar\.sync\s+\d+,\s*128;", ln) else
                    "arrive" if re.match(r"@%p\d+ mbarrier\.arrive", ln) else None)

        events = [(i, event(ln)) for i, ln in enumerate(lines) if event(ln)]
        hand_overs = [n for n, (_, e) in enumerate(events) if e == "stmatrix"
                      and (n + 1 == len(events) or events[n + 1][1] != "stmatrix")]  # each ds^T tile's last store
        assert len(hand_overs) == 2, case  # one per consumer
        for n in hand_overs:  # then the fence, the warpgroup's barrier, one thread's arrive
            assert [e for _, e in events[n + 1:n + 4]] == ["fence", "bar", "arrive"], (case, events[n:n + 4])
        waits = [ln for ln in lines if re.match(r"cp\.async\.bulk\.wait_group\.read\s+0;", ln)]
        assert len(waits) > len(reductions), case  # (and at the end: the consumers' exits may share their code)


def test_compile_check_reports_the_gluon_kernels_of_gluon_plans():
    """``python -m kernels.methods.flash.compile_check`` with Gluon plans compiles the Gluon kernels they launch
    (here the ping-pong forward and the dk/dv pass adding dq) for sm_90 and reports each: warp-specialized,
    no spill at d = 64, the dq reductions."""
    from tests.compiled_report import compile_run

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    run = compile_run(["-m", "kernels.methods.flash.compile_check", "--d", "64",
                       "--fwd", "gluon=2 block_m=128 block_n=128 num_stages=2",
                       "--bwd", "gluon=1 block_n1=128 block_m1=64 num_stages=2 dq_mode=tma_add"], 600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {ln.strip().split(" (Gluon)")[0]: ln for ln in run.stdout.splitlines() if "(Gluon)" in ln}
    assert set(lines) == {"forward", "dk/dv + dq"}, run.stdout  # (no Triton dq pass: dq is added)
    for line in lines.values():
        assert "0 B spill stack" in line and "warp-specialized True" in line and "FAILED" not in line, line
    assert "cp.reduce.async.bulk.tensor.4d" in lines["dk/dv + dq"], lines["dk/dv + dq"]


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
    (4, 12, 1024, 1024, 64, torch.bfloat16, True, "bthd", None),  # more work tiles than SMs (persistent: ~3 each)
]
_GPU_PLANS = [(2, 128, 2, False), (2, 64, 3, False), (1, 128, 2, False), (2, 128, 2, True), (1, 64, 3, True)]
# (gluon, block_n, num_stages, persistent)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("gplan", _GPU_PLANS, ids=lambda p: f"gluon{p[0]}-n{p[1]}-s{p[2]}" + "-persistent" * p[3])
def test_gluon_forward_and_gradients_on_the_gpu(case, gplan, monkeypatch):
    """The Gluon forward (and the backward from its lse) against float64, and element by element against
    the Triton forward (out and lse), ping-pong and free-running, both tile widths, a program a work tile
    and persistent (the GPU's SM count of programs: several tiles a program in the (4, 12, 1024) case,
    at most one in the others)."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    plan = plans.FwdPlan(block_m=128, block_n=gplan[1], num_stages=gplan[2], gluon=gplan[0], persistent=gplan[3])
    launches = []
    real = fwd_gluon.launch_fwd
    monkeypatch.setattr(fwd_gluon, "launch_fwd", lambda *a, **kw: (launches.append(kw), real(*a, **kw))[1])
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plan, None))
    assert len(launches) == 1 and launches[0]["pingpong"] == (gplan[0] == 2)  # the Gluon kernel ran
    assert launches[0]["persistent"] == gplan[3]
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


_GPU_BWD_PLANS = [(1, 64, 2, 64, 2, "pass"), (1, 32, 3, 64, 2, "pass"), (2, 64, 2, 128, 2, "pass"),
                  (2, 32, 3, 64, 3, "pass"), (2, 32, 2, 128, 2, "pass"), (1, 64, 2, 64, 2, "tma_add"),
                  (1, 64, 3, 64, 2, "tma_add")]
# (gluon, block_m1, num_stages, block_n2, dq_stages, dq_mode)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("bplan", _GPU_BWD_PLANS,
                         ids=lambda p: f"gluon{p[0]}-m{p[1]}-s{p[2]}-n{p[3]}-s{p[4]}" + ("-add" * (p[5] == "tma_add")))
def test_gluon_backward_on_the_gpu(case, bplan, monkeypatch):
    """The Gluon dk/dv pass, with the Triton dq pass (gluon=1), the Gluon one (2) or adding dq itself (tma_add),
    against float64, and dq, dk, dv element by element against the Triton backward."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    if d == 128 and bplan[1] == 64 and bplan[5] == "pass":
        pytest.skip("d = 128 takes 32-query dk/dv tiles (64 spill 16 bytes a thread: not a plan the sweep keeps)")
    if d == 128 and bplan[5] == "tma_add" and (bplan[2] > 2 or (tq, layout) != (2048, "bthd")):
        pytest.skip("adding dq at d = 128 (2 slots at most; it spills 128 bytes a thread): the long case only")
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    gluon, block_m1, stages, block_n2, dq_stages, dq_mode = bplan
    plan = plans.BwdPlan(block_n1=128, block_m1=block_m1, num_stages=stages, gluon=gluon, dq_mode=dq_mode,
                         **(dict(block_m2=128, block_n2=block_n2, dq_stages=dq_stages) if gluon == 2 else {}))
    launches = []
    for name in ("launch_dkdv", "launch_dq"):
        real = getattr(bwd_gluon, name)
        spy = (lambda n, f: lambda *a: (launches.append((n, a[13:])), f(*a))[1])(name, real)  # (a[13:]: dq_acc)
        monkeypatch.setattr(bwd_gluon, name, spy)
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plans.FwdPlan(block_m=64, block_n=64), plan))
    assert [n for n, _ in launches] == ["launch_dkdv"] + (["launch_dq"] if gluon == 2 else [])  # the Gluon kernels ran
    assert (launches[0][1][0] is not None) == (dq_mode == "tma_add")  # (dq_acc: dq added by the dk/dv kernel)
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


@pytest.mark.gpu
def test_gluon_backward_adding_dq_runs_the_dq_pass_when_deterministic(monkeypatch):
    """Under torch.use_deterministic_algorithms the tma_add plan's dq comes from the Triton dq pass (TMA
    reductions add in a varying order): the same dq, dk, dv bit for bit as the plan with that pass."""
    q, k, v = (t.detach() for t in make_qkv(2, 3, 300, 300, 64, torch.bfloat16, layout="bthd", device="cuda"))
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    out, lse = launch_fwd(q, k, v, 0.125, True, plans.FwdPlan(block_m=64, block_n=64))
    do = torch.randn_like(out)
    seen = []
    real = bwd_gluon.launch_dkdv
    monkeypatch.setattr(bwd_gluon, "launch_dkdv", lambda *a: (seen.append(a[13]), real(*a))[1])
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        got = launch_bwd(do, q, k, v, out, lse, 0.125, True, GLUON_BWD_ADD)
    finally:
        torch.use_deterministic_algorithms(was)
    want = launch_bwd(do, q, k, v, out, lse, 0.125, True, GLUON_BWD)
    assert seen[0] is None and seen[1] is None
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_gluon_backward_adding_dq_ignores_keys_past_tk_when_every_score_is_very_negative():
    """Keys past Tk (333 keys: the last program's are ragged), not causal, scores of several hundred below
    zero: exp(0 - lse) of the keys TMA read as zeros overflows, and must not reach dq. Against the same
    dk/dv kernel with the Triton dq pass (which masks those keys)."""
    q, k, v = (t.detach() for t in make_qkv(1, 2, 100, 333, 64, torch.bfloat16, device="cuda"))
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    q, k = (q.abs() + 1).mul_(4), (k.abs() + 1).mul_(-4)
    out, lse = launch_fwd(q, k, v, 0.125, False, plans.FwdPlan(block_m=64, block_n=64))
    assert lse.max() < -100
    do = torch.randn_like(out)
    got = launch_bwd(do, q, k, v, out, lse, 0.125, False, GLUON_BWD_ADD)
    want = launch_bwd(do, q, k, v, out, lse, 0.125, False, GLUON_BWD)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, w, atol=2e-2 * w.abs().max().item(), rtol=2e-2, msg=name)


@pytest.mark.parametrize("deterministic", [False, True])
def test_launch_bwd_wires_the_gluon_dkdv_adding_dq(monkeypatch, deterministic):
    """launch_bwd's side of dq_mode="tma_add" with a Gluon plan, on any machine: the Gluon kernel stood in for
    by float64 math (it adds the true dq into the buffer it is given). The buffer is a zeroed fp32
    (B, H, Tq, d) tensor and dq comes out of it in the model's layout; under deterministic algorithms the
    kernel gets no buffer and the Triton dq pass gives dq. Every gradient against float64."""
    from kernels.methods.flash import bwd

    q, k, v = (t.detach() for t in make_qkv(2, 2, 37, 37, 64, torch.bfloat16, layout="bthd"))
    scale = 0.125
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*ref_in, scale=scale, causal=True)
    do = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    ref.backward(do.double())
    given = []

    def fake_dkdv(do_, q_, k_, v_, lse, delta, dk, dv, scale_, causal, block_n, block_m, stages, dq_acc=None):
        given.append(dq_acc)
        dk.copy_(ref_in[1].grad)
        dv.copy_(ref_in[2].grad)
        if dq_acc is not None:
            assert dq_acc.dtype == torch.float32 and dq_acc.is_contiguous() and not dq_acc.any()
            dq_acc += ref_in[0].grad.float()

    monkeypatch.setattr(bwd.fwd_gluon, "supported", lambda *a: None)
    monkeypatch.setattr(bwd, "tma_eligible", lambda *a: True)
    monkeypatch.setattr(bwd_gluon, "launch_dkdv", fake_dkdv)
    out, lse = launch_fwd(q, k, v, scale, True, plans.FwdPlan(block_m=16, block_n=16))
    plan = dataclasses.replace(GLUON_BWD_ADD, block_m2=16, block_n2=16, pre_block=16)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        dq, dk, dv = launch_bwd(do, q, k, v, out, lse, scale, True, plan)
    finally:
        torch.use_deterministic_algorithms(was)
    assert len(given) == 1 and (given[0] is None) == deterministic
    if not deterministic:
        assert given[0].shape == (2, 2, 37, 64)
    assert dq.stride() == q.stride()  # (the model's (B, T, H, d) layout, as every backward's)
    for got, want in zip((dq, dk, dv), ref_in):
        assert kernels.relative_error(got, want.grad) <= kernels.ATTN_BWD_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("case", [_GPU_CASES[i] for i in (0, 2, 3, 5, 6, 11)],  # (ragged, Tq <> Tk, T = 1, long)
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("pingpong", [True, False], ids=["pingpong", "free"])
def test_gluon_persistent_forward_with_few_programs_on_the_gpu(case, pingpong):
    """Three persistent programs take every case's work tiles (one to dozens each, of different weights):
    the q buffers, ring slots and ping-pong turns carried from one work tile to the next give out and lse
    element by element as the Triton forward's."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    q, k, v = (t.detach() for t in make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda"))
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    s = d ** -0.5 if scale is None else scale
    out, lse = fwd_gluon.launch_fwd(q, k, v, s, causal, 128, 128, 2, pingpong=pingpong, persistent=True, programs=3)
    out_t, lse_t = launch_fwd(q, k, v, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out, out_t, atol=tol, rtol=tol)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    fin = torch.isfinite(lse_t)
    torch.testing.assert_close(lse[fin], lse_t[fin], atol=1e-3, rtol=1e-4)
