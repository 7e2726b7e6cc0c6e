"""flash's Gluon kernels (kernels/methods/flash/fwd_gluon.py, plan ``FwdPlan.gluon``; the backward's dk/dv
and dq passes, bwd_gluon.py, plan ``BwdPlan.gluon``): their plans' limits, where they stand aside (an explicit plan
refuses with the reason; a table plan falls back to the Triton kernels), their host side, and on a Hopper
GPU their outputs against float64 and, element by element, against the Triton kernels. The backward's own
tests: test_flash_gluon_bwd.py; the compile for sm_90 without a GPU: test_flash_gluon_compile.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import bwd, fwd_gluon, gluon_common
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from tests.mismatch import where
from tests.test_flash_attention import make_qkv, run_and_compare

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GLUON = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=2)
GLUON_BWD = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, gluon=1)
GLUON_BWD2 = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, block_m2=128, block_n2=64, dq_stages=2, gluon=2)
GLUON_BWD_ADD = plans.BwdPlan(block_n1=128, block_m1=64, num_stages=2, gluon=1, dq_mode="tma_add")


def _need_gluon(q, k, v) -> None:
    """Skip on a GPU the Gluon kernels are not for (compute capability); else the inputs must be theirs."""
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why


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
    assert all(dataclasses.replace(GLUON, gluon=g, overlap=True).overlap for g in (1, 2))
    with pytest.raises(ValueError, match="overlap=True. is the Gluon forward's"):
        plans.FwdPlan(overlap=True)
    # the persistent order's sections of heads: MB of keys and values, the persistent Gluon forward's only
    assert dataclasses.replace(GLUON, persistent=True, section_mb=32).section_mb == 32
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="an int >= 0"):
            dataclasses.replace(GLUON, persistent=True, section_mb=bad)
    with pytest.raises(ValueError, match="persistent=True"):
        dataclasses.replace(GLUON, section_mb=32)
    # three consumers: a 192-query work tile, the Gluon kernel's only (a Triton block is a power of two); their
    # 160 registers hold d = 64's tiles, and d = 128's with 64-key tiles only
    assert dataclasses.replace(GLUON, block_m=192).block_m == 192
    with pytest.raises(ValueError, match="powers of two"):
        plans.FwdPlan(block_m=192)
    assert fwd_gluon.budget_reason(64, 128, 2, True, 192) is None
    assert fwd_gluon.budget_reason(128, 64, 4, True, 192) is None  # (230400 bytes: 96 KB of q, 4 slots of 32 KB)
    assert "block_n=64 or block_m=128" in fwd_gluon.budget_reason(128, 128, 2, False, 192)
    assert "d=96" in fwd_gluon.budget_reason(96, 64, 2, False, 192)
    assert "shared memory" in fwd_gluon.budget_reason(128, 64, 5, True, 192)
    assert fwd_gluon.shared_bytes(64, 128, 2, consumers=3) == fwd_gluon.shared_bytes(64, 128, 2) + 64 * 64 * 2
    assert fwd_gluon.shared_bytes(128, 128, 3) <= fwd_gluon.SHARED_LIMIT < fwd_gluon.shared_bytes(128, 128, 4)
    # persistent programs hold a second pair of q tiles (the next work tile's)
    assert fwd_gluon.shared_bytes(64, 128, 2, persistent=True) == fwd_gluon.shared_bytes(64, 128, 2) + 2 * 64 * 64 * 2
    assert fwd_gluon.budget_reason(128, 128, 3) is None
    assert "persistent" in fwd_gluon.budget_reason(128, 128, 3, persistent=True)
    # the row sums by the tensor cores (sum_mma) hold a block_n x 16 tile of ones, for the free-running consumers only
    ones = 128 * 16 * 2
    assert fwd_gluon.shared_bytes(64, 128, 3, True, 3, sum_mma=True) == fwd_gluon.shared_bytes(64, 128, 3, True, 3) + ones
    assert fwd_gluon.budget_reason(64, 128, 3, True, 192, sum_mma=True) is None
    assert "shared memory" in fwd_gluon.budget_reason(128, 128, 3, sum_mma=True)  # (4 KB past what fits without)
    q = torch.empty(1, 1, 64, 64, dtype=torch.bfloat16)
    for lagged in (dict(pingpong=True), dict(pingpong=False, overlap=True)):
        with pytest.raises(ValueError, match="sum_mma.*free-running"):
            fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 64, 2, sum_mma=True, **lagged)
    # the Triton kernel's blocks shrink to short sequences; the Gluon kernel's tiles stay
    f, _ = plans.clamp(GLUON, plans.BwdPlan(), 5, 7)
    assert (f.block_m, f.block_n) == (128, 128)


def test_gluon_forward_programs_are_for_persistent_launches_only():
    """``programs`` caps the persistent programs: refused without persistent, and below 1 (before any launch);
    one ring slot is refused too (a consumer holds one slot while the next fills: with one, it would wait
    forever)."""
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2 or more ring slots"):
        fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 128, 1)
    with pytest.raises(ValueError, match="is for persistent=True"):
        fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 128, 2, programs=3)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="an int >= 1"):
            fwd_gluon.launch_fwd(q, q, q, 0.125, True, 128, 128, 2, persistent=True, programs=bad)


def test_the_plans_pick_the_consumers_and_the_scale_fold(monkeypatch):
    """A Gluon forward plan's ping-pong, overlap and work tile reach the kernel as PINGPONG / OVERLAP (the
    lagged consumers where either is set) / CONSUMERS, and the one-FMA scores (SCALE_NONNEG) only where the
    scale is >= 0 (max(s * c) = max(s) * c needs c >= 0); a backward plan's overlap reaches the Gluon dk/dv
    pass."""
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    from kernels.runtime import fastlaunch

    seen = []
    monkeypatch.setattr(fastlaunch, "launch", lambda kernel, grid, args, meta, device=None: seen.append((grid, meta)))
    monkeypatch.setattr(gluon_common, "supported", lambda *t: None)  # (the Gluon kernel's checks are the GPU's)
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    for gluon, overlap, scale, block_m in ((1, False, 0.125, 128), (1, True, 0.125, 128), (2, False, -0.3, 128),
                                           (2, True, 0.0, 128), (2, True, 0.125, 192)):
        plan = dataclasses.replace(GLUON, gluon=gluon, overlap=overlap, block_m=block_m)
        launch_fwd(q, q, q, scale, True, plan)
        grid, meta = seen[-1]
        assert (meta["PINGPONG"], meta["OVERLAP"], meta["SCALE_NONNEG"]) == (gluon == 2, overlap, scale >= 0)
        # a program a work tile of block_m queries, 64 a consumer (2 heads of 300 queries)
        assert grid == (-(-300 // block_m) * 2,) and meta["BLOCK_M"] == 64 and meta["CONSUMERS"] == block_m // 64
    seen.clear()  # the backward's Gluon passes: BwdPlan.overlap reaches the dk/dv kernel
    monkeypatch.setattr(bwd, "tma_eligible", lambda *t: True)
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 300)
    for overlap in (False, True):
        plan = dataclasses.replace(GLUON_BWD2, overlap=overlap)
        launch_bwd(torch.zeros_like(out), q, q, q, out, lse, 0.125, True, plan)
    dkdv = [m["OVERLAP"] for _, m in seen if "DQ" in m]
    assert dkdv == [False, True] and sum("STAGES" in m and "DQ" not in m for _, m in seen) == 2  # (and 2 dq passes)


def test_the_persistent_order_takes_heads_in_sections_of_section_mb(monkeypatch):
    """``section_heads``: as many heads as have keys and values (Tk x (d + dv) x 2 bytes each) within section_mb
    MB, at least one, at most every head; 0 is every head. The count reaches the kernel as n_sec, from the plan."""
    assert fwd_gluon.section_heads(32, 2048, 128, 128, 2, 128) == 32  # (1 MB a head)
    assert fwd_gluon.section_heads(32, 4096, 64, 64, 2, 48) == 32
    assert fwd_gluon.section_heads(32, 16384, 64, 64, 2, 12) == 8
    assert fwd_gluon.section_heads(32, 1024, 64, 64, 2, 192) == 128
    assert fwd_gluon.section_heads(1, 8192, 128, 128, 2, 12) == 1  # (4 MB a head: still one)
    assert fwd_gluon.section_heads(64, 100, 64, 64, 2, 6) == 6  # (never more than there are)
    assert fwd_gluon.section_heads(0, 2048, 128, 128, 2, 128) == 128
    assert fwd_gluon.section_heads(32, 2048, 128, 128, 2, 8, group=7) == 56  # (8 kv heads' 7 query heads each)
    assert fwd_gluon.section_heads(0, 2048, 128, 128, 2, 8, group=7) == 56
    for bad in (-1, 2.0, False):
        with pytest.raises(ValueError, match="an int >= 0"):
            fwd_gluon.section_heads(bad, 2048, 128, 128, 2, 128)
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    from kernels.runtime import fastlaunch

    seen = []
    monkeypatch.setattr(fastlaunch, "launch", lambda kernel, grid, args, meta, device=None: seen.append((args, meta)))
    monkeypatch.setattr(gluon_common, "supported", lambda *t: None)
    monkeypatch.setattr(fwd_gluon, "device_props", lambda device: type("P", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q = torch.zeros(1, 6, 4096, 64, dtype=torch.bfloat16)  # (1 MB of keys and values a head)
    for mb, heads in ((0, 6), (2, 2), (4, 4), (64, 6)):
        launch_fwd(q, q, q, 0.125, True, dataclasses.replace(GLUON, persistent=True, section_mb=mb))
        args, meta = seen[-1]
        assert args[-1] == heads and args[-2] == 6 and meta["LEVELS"]  # (n_sec after n_bh)


def test_gluon_descriptors_skip_the_checks_only_where_they_come_out_the_same(monkeypatch):
    """Descriptors of tensors the kernels take are made without the dataclass's checks once the first one
    made both ways compared equal; where they would not, every one is made the checked way."""
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q = torch.zeros(2, 40, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
    monkeypatch.setattr(gluon_common, "_UNCHECKED", None)
    first = gluon_common.descriptor(q, 64)
    assert gluon_common._UNCHECKED is True
    made = []
    monkeypatch.setattr(gluon_common, "GluonDescriptor", lambda *a: made.append(a) or first)
    again = gluon_common.descriptor(q[:, :, 1:], 64)  # (another view: its own shape and base)
    assert not made and again is not first and list(again.shape) == [2, 3, 39, 64] and again.base.data_ptr() != 0
    assert again.block_shape == [1, 1, 64, 64] and again.layout == first.layout
    monkeypatch.setattr(gluon_common, "_UNCHECKED", None)
    monkeypatch.setattr(gluon_common, "_unchecked", lambda *a: None)  # (a Triton whose descriptors differ)
    gluon_common.descriptor(q, 64)
    gluon_common.descriptor(q, 64)
    assert gluon_common._UNCHECKED is False and len(made) == 2


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
    taken = []  # the Triton plans the launchers fell back to
    real = plans.triton_plans
    monkeypatch.setattr(plans, "triton_plans", lambda *a: taken.append(real(*a)) or taken[-1])
    try:
        fp, bp = plans.plans_for(64, 64, torch.bfloat16, True, 37, 37)
        assert fp.gluon and bp.gluon
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = kernels.attention(qg, kg, vg, causal=True, method="flash")  # (the table's plans: no override)
        do = torch.randn_like(out)
        out.backward(do)
        assert len(taken) == 2 and not taken[0][0].gluon and not taken[1][1].gluon  # forward, then backward
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


def test_supported_takes_grouped_heads_only_where_the_gluon_grouped_path_is_on(monkeypatch):
    """``gluon_common.supported`` on a (faked) Hopper GPU: k and v with as many heads as q pass; grouped heads
    (6 on 2) are refused naming ``GROUPED`` while the grouped path awaits its GPU check, and pass once it is on;
    kv heads that do not divide q's are refused either way."""
    import types

    def fake(heads):
        return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), dtype=torch.bfloat16,
                                     shape=(1, heads, 8, 64), numel=lambda: 1)

    monkeypatch.setattr(gluon_common, "GLUON_ERROR", None)
    monkeypatch.setattr(gluon_common, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(gluon_common, "device_props", lambda device: types.SimpleNamespace(major=9, minor=0))
    monkeypatch.setattr(gluon_common, "tma_eligible", lambda *t: True)
    q, kv, odd = fake(6), fake(2), fake(4)
    assert gluon_common.supported(q, q, q) is None
    monkeypatch.setattr(gluon_common, "GROUPED", False)
    assert "GROUPED" in gluon_common.supported(q, kv, kv)
    monkeypatch.setattr(gluon_common, "GROUPED", True)
    assert gluon_common.supported(q, kv, kv) is None
    assert "dividing q's" in gluon_common.supported(q, odd, odd)


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
_GPU_PLANS = [(2, 128, 2, False, False, 128, False), (2, 64, 3, False, True, 128, False),
              (1, 128, 2, False, False, 128, False), (2, 128, 2, True, True, 128, False),
              (1, 64, 3, True, False, 128, False), (1, 128, 2, True, True, 128, False),
              (1, 64, 3, False, True, 128, False), (2, 64, 3, True, True, 192, False),
              (1, 128, 2, False, False, 192, False), (1, 64, 2, True, True, 192, False),
              (1, 64, 4, True, False, 192, False), (1, 128, 3, True, False, 192, True),
              (1, 64, 3, True, False, 192, True), (1, 128, 2, False, False, 128, True)]
# (gluon, block_n, num_stages, persistent, overlap, block_m: 192 is three consumers: d = 64, or d = 128 with
# 64-key tiles; sum_mma: the row sums by the tensor cores)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("gplan", _GPU_PLANS,
                         ids=lambda p: f"gluon{p[0]}-m{p[5]}-n{p[1]}-s{p[2]}" + "-persistent" * p[3]
                         + "-overlap" * p[4] + "-sum_mma" * p[6])
def test_gluon_forward_and_gradients_on_the_gpu(case, gplan, monkeypatch):
    """The Gluon forward (and the backward from its lse) against float64, and element by element against
    the Triton forward (out and lse), ping-pong and free-running, with and without the overlap, two and three
    consumers, both tile widths, a program a work tile and persistent (the GPU's SM count of programs:
    several tiles a program in the (4, 12, 1024) case, at most one in the others), the row sums by a reduction
    and by the tensor cores."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    if gplan[5] == 192 and d != 64 and gplan[1] != 64:
        pytest.skip("three consumers (160 registers a thread) take d = 128 with 64-key tiles only")
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    _need_gluon(q, k, v)
    plan = plans.FwdPlan(block_m=gplan[5], block_n=gplan[1], num_stages=gplan[2], gluon=gplan[0], persistent=gplan[3],
                         overlap=gplan[4], sum_mma=gplan[6])
    launches = []
    real = fwd_gluon.launch_fwd
    monkeypatch.setattr(fwd_gluon, "launch_fwd", lambda *a, **kw: (launches.append(kw), real(*a, **kw))[1])
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plan, None))
    assert len(launches) == 1 and launches[0]["pingpong"] == (gplan[0] == 2)  # the Gluon kernel ran
    assert launches[0]["persistent"] == gplan[3] and launches[0]["overlap"] == gplan[4]
    assert launches[0]["sum_mma"] == gplan[6]
    s = d ** -0.5 if scale is None else scale
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = launch_fwd(qd, kd, vd, s, causal, plan)
    out_t, lse_t = launch_fwd(qd, kd, vd, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3  # (summation orders differ: a rounding or two)
    torch.testing.assert_close(out, out_t, atol=tol, rtol=tol, msg=lambda m: f"{m}\n{where(out, out_t, tol, tol, 128)}")
    assert out.stride() == out_t.stride()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    fin = torch.isfinite(lse_t)
    # (sum_mma: l sums the 16-bit p, so lse = m + log(l) lies within about 2^-9 of the fp32 sum's)
    torch.testing.assert_close(lse[fin], lse_t[fin], atol=4e-3 if gplan[6] else 1e-3, rtol=1e-4)
    if causal and tq > tk:
        assert (out[:, :, :tq - tk] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case", [_GPU_CASES[i] for i in (0, 2, 3, 5, 6, 11)],  # (ragged, Tq <> Tk, T = 1, long)
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("pingpong,overlap,block_m,sum_mma",
                         [(True, False, 128, False), (False, False, 128, False), (True, True, 128, False),
                          (False, True, 128, False), (True, False, 192, False), (False, False, 192, False),
                          (False, False, 192, True)],
                         ids=["pingpong", "free", "pingpong-overlap", "free-overlap", "3-pingpong", "3-free",
                              "3-free-sum_mma"])
def test_gluon_persistent_forward_with_few_programs_on_the_gpu(case, pingpong, overlap, block_m, sum_mma):
    """Three persistent programs take every case's work tiles (one to dozens each, of different weights):
    the q buffers, ring slots and ping-pong turns (two consumers, or three in a ring) carried from one work
    tile to the next give out and lse element by element as the Triton forward's."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    block_n = 64 if block_m == 192 and d == 128 else 128  # (three consumers hold d = 128's 64-key tiles only)
    q, k, v = (t.detach() for t in make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda"))
    _need_gluon(q, k, v)
    s = d ** -0.5 if scale is None else scale
    out, lse = fwd_gluon.launch_fwd(q, k, v, s, causal, block_m, block_n, 2, pingpong=pingpong, persistent=True,
                                    programs=3, overlap=overlap, sum_mma=sum_mma)
    out_t, lse_t = launch_fwd(q, k, v, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out, out_t, atol=tol, rtol=tol, msg=lambda m: f"{m}\n{where(out, out_t, tol, tol, 128)}")
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    fin = torch.isfinite(lse_t)
    torch.testing.assert_close(lse[fin], lse_t[fin], atol=4e-3 if sum_mma else 1e-3, rtol=1e-4)




@pytest.mark.gpu
@pytest.mark.parametrize("case", [_GPU_CASES[i] for i in (0, 11)], ids=["300-d64", "4x12x1024-d64"])
@pytest.mark.parametrize("heads,programs,block_m", [(1, 3, 128), (4, 3, 192), (5, None, 128), (7, 5, 192)])
def test_gluon_persistent_forward_in_sections_on_the_gpu(case, heads, programs, block_m, monkeypatch):
    """The persistent causal order taken a section of heads at a time (``FwdPlan.section_mb``; here the heads a
    section holds set directly, the last section smaller where they do not divide the heads: 6 and 48 of them):
    every work tile taken once, out and lse element by element as the Triton forward's."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    q, k, v = (t.detach() for t in make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda"))
    _need_gluon(q, k, v)
    monkeypatch.setattr(fwd_gluon, "section_heads", lambda *a: heads)
    s = d ** -0.5
    out, lse = fwd_gluon.launch_fwd(q, k, v, s, causal, block_m, 128, 2, pingpong=False, persistent=True,
                                    programs=programs, section_mb=1)
    out_t, lse_t = launch_fwd(q, k, v, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    torch.testing.assert_close(out, out_t, atol=2e-2, rtol=2e-2,
                               msg=lambda m: f"{m}\n{where(out, out_t, 2e-2, 2e-2, 128)}")
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    fin = torch.isfinite(lse_t)
    torch.testing.assert_close(lse[fin], lse_t[fin], atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
def test_gluon_forward_plan_with_sections_on_the_gpu(monkeypatch):
    """A table-style plan with ``section_mb`` (1 MB: one head a section at (1, 4, 2048, 128)) through the method's
    launch path, forward and gradients against float64."""
    q, k, v = make_qkv(1, 4, 2048, 2048, 128, torch.float16, layout="bthd", device="cuda")
    _need_gluon(q, k, v)
    plan = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=1, persistent=True, section_mb=1)
    launches = []
    real = fwd_gluon.launch_fwd
    monkeypatch.setattr(fwd_gluon, "launch_fwd", lambda *a, **kw: (launches.append(kw), real(*a, **kw))[1])
    run_and_compare(q, k, v, causal=True, scale=None, plan=(plan, None))
    assert [kw["section_mb"] for kw in launches] == [1]
