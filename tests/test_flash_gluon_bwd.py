"""flash's Gluon backward (kernels/methods/flash/bwd_gluon.py, plan ``BwdPlan.gluon``: the dk/dv pass, with the
Triton or the Gluon dq pass, or adding dq itself by TMA reductions, by turns or split between its consumers): its
plans' limits, launch_bwd's wiring of it, and on a Hopper GPU its gradients against float64 and, element by
element, against the Triton kernels. The forward and what both share: test_flash_gluon.py; their compile
for sm_90 without a GPU: test_flash_gluon_compile.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import bwd, bwd_gluon, bwd_gluon_dq, fwd_gluon, gluon_common
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from tests.mismatch import where
from tests.test_flash_attention import make_qkv, run_and_compare
from tests.test_flash_gluon import _GPU_CASES, GLUON_BWD, GLUON_BWD2, GLUON_BWD_ADD, _need_gluon

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")


def _backward_inputs(d: int = 64):
    """q, k, v (2, 3, 300, d) bf16 in the model's layout, the Triton forward's out and lse (scale d^-0.5), and a
    random do."""
    q, k, v = (t.detach() for t in make_qkv(2, 3, 300, 300, d, torch.bfloat16, layout="bthd", device="cuda"))
    _need_gluon(q, k, v)
    out, lse = launch_fwd(q, k, v, d ** -0.5, True, plans.FwdPlan(block_m=64, block_n=64))
    return q, k, v, out, lse, torch.randn_like(out)


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
    assert all(dataclasses.replace(p, overlap=True).overlap for p in (GLUON_BWD, GLUON_BWD2, GLUON_BWD_ADD))
    with pytest.raises(ValueError, match="overlap=True. is the Gluon dk/dv pass's"):
        plans.BwdPlan(overlap=True)
    for bad in (dict(block_m1=32), dict(gluon=2, block_m2=128, block_n2=64, dq_stages=2)):
        with pytest.raises(ValueError, match="tma_add"):  # (a warpgroup's dq tile is 64 queries; no dq pass to run)
            dataclasses.replace(GLUON_BWD_ADD, **bad)
    # dq's buffers: two tiles' ds^T of both consumers (16-bit) and each consumer's fp32 dq tile
    extra = 4 * 64 * 64 * 2 + 2 * 64 * 64 * 4
    assert bwd_gluon.shared_bytes(64, 64, 2, dq=True) == bwd_gluon.shared_bytes(64, 64, 2) + extra
    assert bwd_gluon.budget_reason(128, GLUON_BWD_ADD) is None  # (225 KB of the 227)
    assert "dk/dv kernel" in bwd_gluon.budget_reason(128, dataclasses.replace(GLUON_BWD_ADD, num_stages=3))
    # dq split between the consumers: each one's fp32 tile is half as wide, so three slots fit at d = 128
    split = dataclasses.replace(GLUON_BWD_ADD, dq_split=True)
    assert bwd_gluon.shared_bytes(64, 64, 2, dq=True, dq_split=True) == bwd_gluon.shared_bytes(64, 64, 2, dq=True) - 64 * 32 * 4 * 2
    assert bwd_gluon.budget_reason(128, dataclasses.replace(split, num_stages=3)) is None
    assert "dq_split takes d = 128" in bwd_gluon.budget_reason(64, split)  # (a column slice inside a swizzle atom)
    assert bwd_gluon.budget_reason(64, split, add_dq=False) is None  # (deterministic: no dq added, nothing split)
    for bad in (GLUON_BWD, GLUON_BWD2, plans.BwdPlan(dq_mode="tma_add")):
        with pytest.raises(ValueError, match="dq_split=True. splits the dq"):
            dataclasses.replace(bad, dq_split=True)
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
    # the programs' LPT order: MB of streamed tiles a section of heads holds, the Gluon passes' only
    assert all(dataclasses.replace(p, lpt_mb=16).lpt_mb == 16 for p in (GLUON_BWD, GLUON_BWD2, GLUON_BWD_ADD))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="an int >= 0"):
            dataclasses.replace(GLUON_BWD2, lpt_mb=bad)
    with pytest.raises(ValueError, match="lpt_mb > 0. orders the Gluon passes"):
        plans.BwdPlan(lpt_mb=16)


_GPU_BWD_PLANS = [(1, 64, 2, 64, 2, "pass", False), (1, 32, 3, 64, 2, "pass", True), (2, 64, 2, 128, 2, "pass", False),
                  (2, 64, 4, 64, 3, "pass", False),
                  (2, 32, 3, 64, 3, "pass", True), (2, 32, 2, 128, 2, "pass", False),
                  (1, 64, 2, 64, 2, "tma_add", False), (1, 64, 3, 64, 2, "tma_add", True),
                  (1, 64, 2, 64, 2, "tma_split", False), (1, 64, 3, 64, 2, "tma_split", True)]
# (gluon, block_m1, num_stages, block_n2, dq_stages, dq_mode, overlap; "tma_split": tma_add with dq_split)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES,
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}-s{c[8]}")
@pytest.mark.parametrize("bplan", _GPU_BWD_PLANS,
                         ids=lambda p: f"gluon{p[0]}-m{p[1]}-s{p[2]}-n{p[3]}-s{p[4]}"
                         + {"tma_add": "-add", "tma_split": "-split"}.get(p[5], "") + "-overlap" * p[6])
def test_gluon_backward_on_the_gpu(case, bplan, monkeypatch):
    """The Gluon dk/dv pass, with the Triton dq pass (gluon=1), the Gluon one (2) or adding dq itself (tma_add,
    by turns or split between the consumers), each product waited for at once or only where needed next
    (overlap), against float64, and dq, dk, dv element by element against the Triton backward."""
    B, H, tq, tk, d, dtype, causal, layout, scale = case
    if d == 128 and bplan[:2] == (1, 64) and bplan[5] == "pass":
        pytest.skip("gluon=1 at d = 128 takes 32-query dk/dv tiles (64 spill 16 bytes a thread: not a plan the "
                    "sweep keeps)")
    if d == 128 and bplan[5] == "tma_add" and (bplan[2] > 2 or (tq, layout) != (2048, "bthd")):
        pytest.skip("adding dq at d = 128 (2 slots at most; it spills 128 bytes a thread): the long case only")
    if d != 128 and bplan[5] == "tma_split":
        pytest.skip("dq split between the consumers: d = 128 only")
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    _need_gluon(q, k, v)
    gluon, block_m1, stages, block_n2, dq_stages, dq_mode, overlap = bplan
    split = dq_mode == "tma_split"
    dq_mode = "tma_add" if split else dq_mode
    plan = plans.BwdPlan(block_n1=128, block_m1=block_m1, num_stages=stages, gluon=gluon, dq_mode=dq_mode,
                         overlap=overlap, dq_split=split,
                         **(dict(block_m2=128, block_n2=block_n2, dq_stages=dq_stages) if gluon == 2 else {}))
    launches = []
    for module, name in ((bwd_gluon, "launch_dkdv"), (bwd_gluon_dq, "launch_dq")):
        real = getattr(module, name)
        spy = (lambda n, f: lambda *a, **kw: (launches.append((n, a[13:], kw)), f(*a, **kw))[1])(name, real)
        monkeypatch.setattr(module, name, spy)  # (a[13:]: dk/dv's dq_acc)
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plans.FwdPlan(block_m=64, block_n=64), plan))
    assert [n for n, _, _ in launches] == ["launch_dkdv"] + (["launch_dq"] if gluon == 2 else [])  # the Gluon kernels
    assert (launches[0][1][0] is not None) == (dq_mode == "tma_add")  # (dq_acc: dq added by the dk/dv kernel)
    assert launches[0][2]["overlap"] == overlap  # (the dk/dv pass's; the dq pass has no such option)
    assert launches[0][2]["dq_split"] == split
    s = d ** -0.5 if scale is None else scale
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = launch_fwd(qd, kd, vd, s, causal, plans.FwdPlan(block_m=64, block_n=64))
    do = torch.randn_like(out)
    got = launch_bwd(do, qd, kd, vd, out, lse, s, causal, plan)
    want = launch_bwd(do, qd, kd, vd, out, lse, s, causal, plans.BwdPlan(block_m1=32, block_n1=64))
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.stride() == w.stride(), name
        atol = tol * max(1.0, w.abs().max().item())
        torch.testing.assert_close(g, w, atol=atol, rtol=tol, msg=lambda m: f"{name}: {m}\n{where(g, w, atol, tol)}")


@pytest.mark.gpu
def test_gluon_backward_adding_dq_runs_the_dq_pass_when_deterministic(monkeypatch):
    """Under torch.use_deterministic_algorithms the tma_add plan's dq comes from the Triton dq pass (TMA
    reductions add in a varying order): the same dq, dk, dv bit for bit as the plan with that pass."""
    q, k, v, out, lse, do = _backward_inputs()
    seen = []
    real = bwd_gluon.launch_dkdv
    monkeypatch.setattr(bwd_gluon, "launch_dkdv", lambda *a, **kw: (seen.append(a[13]), real(*a, **kw))[1])
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
    _need_gluon(q, k, v)
    q, k = (q.abs() + 1).mul_(4), (k.abs() + 1).mul_(-4)
    out, lse = launch_fwd(q, k, v, 0.125, False, plans.FwdPlan(block_m=64, block_n=64))
    assert lse.max() < -100
    do = torch.randn_like(out)
    got = launch_bwd(do, q, k, v, out, lse, 0.125, False, GLUON_BWD_ADD)
    want = launch_bwd(do, q, k, v, out, lse, 0.125, False, GLUON_BWD)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        atol = 2e-2 * w.abs().max().item()
        torch.testing.assert_close(g, w, atol=atol, rtol=2e-2, msg=lambda m: f"{name}: {m}\n{where(g, w, atol, 2e-2)}")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_launch_bwd_wires_the_gluon_dkdv_adding_dq(monkeypatch, deterministic, split):
    """launch_bwd's side of dq_mode="tma_add" with a Gluon plan, on any machine: the Gluon kernel stood in for
    by float64 math (it adds the true dq into the buffer it is given). The buffer is a zeroed fp32
    (B, H, Tq, d) tensor and dq comes out of it in the model's layout; under deterministic algorithms the
    kernel gets no buffer (nor the plan's dq_split) and the Triton dq pass gives dq. Every gradient against
    float64."""

    d = 128 if split else 64  # (dq_split: d = 128 only)
    q, k, v = (t.detach() for t in make_qkv(2, 2, 37, 37, d, torch.bfloat16, layout="bthd"))
    scale = 0.125
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*ref_in, scale=scale, causal=True)
    do = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    ref.backward(do.double())
    given, splits = [], []

    def fake_dkdv(do_, q_, k_, v_, lse, delta, dk, dv, scale_, causal, block_n, block_m, stages, dq_acc=None,
                  overlap=False, dq_split=False, lpt_mb=0, launched=None):
        given.append(dq_acc)
        splits.append(dq_split)
        dk.copy_(ref_in[1].grad)
        dv.copy_(ref_in[2].grad)
        if dq_acc is not None:
            assert dq_acc.dtype == torch.float32 and dq_acc.is_contiguous() and not dq_acc.any()
            dq_acc += ref_in[0].grad.float()

    monkeypatch.setattr(gluon_common, "supported", lambda *a: None)
    monkeypatch.setattr(bwd, "tma_eligible", lambda *a: True)
    monkeypatch.setattr(bwd_gluon, "launch_dkdv", fake_dkdv)
    out, lse = launch_fwd(q, k, v, scale, True, plans.FwdPlan(block_m=16, block_n=16))
    plan = dataclasses.replace(GLUON_BWD_ADD, block_m2=16, block_n2=16, pre_block=16, dq_split=split)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        dq, dk, dv = launch_bwd(do, q, k, v, out, lse, scale, True, plan)
    finally:
        torch.use_deterministic_algorithms(was)
    assert len(given) == 1 and (given[0] is None) == deterministic
    assert splits == [split and not deterministic]
    if not deterministic:
        assert given[0].shape == (2, 2, 37, d)
    assert dq.stride() == q.stride()  # (q's own layout, here the model's (B, T, H, d): tiles.empty_grad)
    for got, want in zip((dq, dk, dv), ref_in):
        assert kernels.relative_error(got, want.grad) <= kernels.ATTN_BWD_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("gluon", [1, 2])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_dkdv_after_the_dq_pass_that_forms_delta(monkeypatch, gluon, d):
    """BwdPlan(gluon=1 or 2, delta_in_dq=True): the dq pass (Triton's, or the Gluon one) first, forming delta,
    then the Gluon dk/dv pass reading it, no delta kernel; the same gradients as with the delta kernel (to its
    summation order), on rows that end inside a tile (T = 300) and with do's rows past T zero-filled."""
    from kernels.methods.flash import bwd as fb

    q, k, v, out, lse, do = _backward_inputs(d)
    scale = d ** -0.5
    base = dataclasses.replace(GLUON_BWD2 if gluon == 2 else GLUON_BWD, block_m1=32 if d == 128 else 64)
    order = []
    real_launch = fb.fastlaunch.launch
    monkeypatch.setattr(fb.fastlaunch, "launch", lambda kernel, grid, args, meta, *r: (
        order.append(getattr(kernel, "fn", kernel).__name__), real_launch(kernel, grid, args, meta, *r))[1])
    got = launch_bwd(do, q, k, v, out, lse, scale, True, dataclasses.replace(base, delta_in_dq=True))
    # the dq pass (forming delta), then the Gluon dk/dv pass; no delta kernel
    first = "_bwd_kernel" if gluon == 1 else "_dq_ws_kernel"
    assert order == [first, "_dkdv_ws_kernel"], order
    order.clear()
    want = launch_bwd(do, q, k, v, out, lse, scale, True, base)
    assert order[0] == "_delta_kernel", order
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        atol = 1e-2 * w.abs().max().item()
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-2, msg=lambda m: f"{name}: {m}\n{where(g, w, atol, 1e-2)}")


def _recorded_launches(monkeypatch) -> list:
    """(kernel name, grid, arguments, meta) of each launch from here on, none run; the Gluon kernels taking any
    inputs (their checks are the GPU's). Skips where this Triton has no Gluon."""
    if bwd_gluon.GLUON_ERROR:
        pytest.skip(bwd_gluon.GLUON_ERROR)
    from kernels.runtime import fastlaunch

    seen = []
    monkeypatch.setattr(fastlaunch, "launch", lambda kernel, grid, args, meta, device=None: seen.append(
        (getattr(kernel, "fn", kernel).__name__, grid, args, meta)))
    monkeypatch.setattr(gluon_common, "supported", lambda *t: None)
    monkeypatch.setattr(bwd, "tma_eligible", lambda *t: True)
    return seen


def test_the_backward_passes_start_in_lpt_sections_of_lpt_mb(monkeypatch):
    """``lpt_heads``: as many heads as have the tiles a pass streams (rows x (d + dv) x 2 bytes each: the dk/dv
    pass's q and do, the dq pass's k and v) within lpt_mb MB, at least one, at most every head; 0 is one (head by
    head). Both Gluon passes get the count (n_sec) and LPT from the plan, each of its own tensors' rows."""
    assert bwd_gluon.lpt_heads(0, 2048, 128, 128, 2, 128) == 1
    assert bwd_gluon.lpt_heads(32, 2048, 128, 128, 2, 128) == 32  # (1 MB a head)
    assert bwd_gluon.lpt_heads(32, 4096, 64, 64, 2, 48) == 32
    assert bwd_gluon.lpt_heads(1, 8192, 128, 128, 2, 12) == 1  # (4 MB a head: still one)
    assert bwd_gluon.lpt_heads(64, 100, 64, 64, 2, 6) == 6  # (never more than there are)
    seen = _recorded_launches(monkeypatch)
    q = torch.zeros(1, 6, 2048, 64, dtype=torch.bfloat16)  # (512 KB of q and do, or of k and v, a head)
    k = torch.zeros(1, 6, 4096, 64, dtype=torch.bfloat16)  # (1 MB of k and v a head: the dq pass's sections)
    lse = torch.zeros(1, 6, 2048)
    for mb, dkdv_heads, dq_heads in ((0, 1, 1), (1, 2, 1), (2, 4, 2), (64, 6, 6)):
        seen.clear()
        launch_bwd(torch.zeros_like(q), q, k, k, torch.zeros_like(q), lse, 0.125, True,
                   dataclasses.replace(GLUON_BWD2, lpt_mb=mb))
        (dq_name, dq_grid, dq_args, dq_meta), = [c for c in seen if c[0] == "_dq_ws_kernel"]
        (_, kv_grid, kv_args, kv_meta), = [c for c in seen if c[0] == "_dkdv_ws_kernel"]
        assert kv_meta["LPT"] == dq_meta["LPT"] == (mb > 0) and kv_grid == (4096 // 128, 6, 1)
        assert dq_grid == (2048 // 128, 6, 1)
        assert kv_args[-2] == dkdv_heads and dq_args[-1] == dq_heads  # (n_sec: after scale)


def test_grouped_heads_launch_the_gluon_passes_over_kv_heads(monkeypatch):
    """Grouped-query attention (6 query heads on 2 kv heads): the dk/dv programs span the kv heads (grid axis 1)
    with KV_GROUP = 3, their LPT sections counted in kv heads streaming 3 heads' q and do; the dq programs span the
    query heads, their sections a kv head's 3 query heads at a time; the forward gets KV_GROUP too. Heads that do
    not divide are refused before any launch."""
    from kernels.methods.flash import fwd_gluon

    seen = _recorded_launches(monkeypatch)
    q = torch.zeros(1, 6, 2048, 64, dtype=torch.bfloat16)  # (512 KB of q and do a head)
    k = torch.zeros(1, 2, 2048, 64, dtype=torch.bfloat16)  # (512 KB of k and v a kv head)
    lse = torch.zeros(1, 6, 2048)
    launch_bwd(torch.zeros_like(q), q, k, k, torch.zeros_like(q), lse, 0.125, True,
               dataclasses.replace(GLUON_BWD2, lpt_mb=1))
    (_, dq_grid, dq_args, dq_meta), = [c for c in seen if c[0] == "_dq_ws_kernel"]
    (_, kv_grid, kv_args, kv_meta), = [c for c in seen if c[0] == "_dkdv_ws_kernel"]
    assert kv_grid == (2048 // 128, 2, 1) and kv_meta["KV_GROUP"] == 3
    assert kv_args[-2] == 1  # (1.5 MB of q and do a kv head: one a section)
    assert dq_grid == (2048 // 128, 6, 1) and dq_meta["KV_GROUP"] == 3
    assert dq_args[-1] == 6  # (two kv heads' k and v in 1 MB: their 6 query heads)
    seen.clear()
    fwd_gluon.launch_fwd(q, k, k, 0.125, True, 128, 64, 2)
    (_, _, fargs, fmeta), = seen
    assert fmeta["KV_GROUP"] == 3 and fargs[-1] == 6  # (n_sec: every head, in query heads)
    with pytest.raises(ValueError, match="dividing q's"):
        fwd_gluon.launch_fwd(q, torch.zeros(1, 4, 2048, 64, dtype=torch.bfloat16), k, 0.125, True, 128, 64, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["pass", "tma_add"])
def test_gluon_backward_in_lpt_sections_matches_head_by_head(d, causal, mode):
    """BwdPlan.lpt_mb only changes the order the programs start in: 2 MB sections of 4 heads of 6 (the last one
    of 2; 512 KB of streamed tiles a head at d = 64) and of 2 heads at d = 128 (1 MB a head) give dk and dv
    (and the dq pass's dq) bit for bit as head by head, causal and not; a program skipped or taken twice would
    not (dq added by TMA reductions sums in a varying order: to its tolerance)."""
    if mode == "tma_add" and d == 128:
        pytest.skip("the d = 128 plans take the dq pass")
    q, k, v = (t.detach() for t in make_qkv(2, 3, 2048, 2048, d, torch.bfloat16, layout="bthd", device="cuda"))
    _need_gluon(q, k, v)
    scale = d ** -0.5
    out, lse = launch_fwd(q, k, v, scale, causal, plans.FwdPlan(block_m=64, block_n=64))
    do = torch.randn_like(out)
    base = GLUON_BWD_ADD if mode == "tma_add" else dataclasses.replace(GLUON_BWD2, delta_in_dq=d == 128)
    want = launch_bwd(do, q, k, v, out, lse, scale, causal, base)
    got = launch_bwd(do, q, k, v, out, lse, scale, causal, dataclasses.replace(base, lpt_mb=2))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        if name == "dq" and mode == "tma_add":
            atol = 1e-2 * w.abs().max().item()
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-2)
        else:
            assert torch.equal(g, w), f"{name}: {where(g, w, 0, 0)}"
