"""The flash kernels' loop variants: plan switches that change what a loop does a tile, not its tiles (the row
sums by the tensor cores, ``FwdPlan.sum_mma``; the masked tiles inside the full tiles' loop, ``FwdPlan.one_loop``
and ``BwdPlan.one_loop``), each against the plain kernels and float64, with the plans they refuse. The helpers and
the CPU/GPU split are tests/test_flash_attention.py's; the launch recorder is tests/test_flash_plans.py's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from tests.test_flash_attention import SMALL, SMALL_BWD, SMALL_FWD, make_qkv, run_and_compare
from tests.test_flash_plans import _recorded_launches

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")


def _forward_variant_matches(monkeypatch, plan, flag, tq, tk, dtype, tol, lse_tol, causal=True, scale=None):
    """The forward under ``plan`` (launched with its constexpr ``flag`` set, SMALL's without it): out and the
    gradients within the float64 tolerances; out within ``tol`` and lse within ``lse_tol`` of SMALL's forward's;
    rows with no key (causal, Tq > Tk) 0 with lse +inf."""
    seen = _recorded_launches(monkeypatch, (plan, SMALL_BWD), run=False)
    assert seen[0][2][flag] is True
    assert _recorded_launches(monkeypatch, SMALL, run=False)[0][2][flag] is False
    monkeypatch.undo()
    q, k, v = make_qkv(2, 2, tq, tk, 16, dtype, layout="bthd")
    run_and_compare(q, k, v, causal=causal, scale=scale, plan=(plan, SMALL_BWD))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    s = 0.25 if scale is None else scale
    out, lse = launch_fwd(qd, kd, vd, s, causal, plan)
    out_r, lse_r = launch_fwd(qd, kd, vd, s, causal, SMALL_FWD)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, out_r, atol=tol, rtol=tol)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_r)) and (torch.isinf(lse).any() == (causal and tq > tk))
    fin = torch.isfinite(lse_r)
    torch.testing.assert_close(lse[fin], lse_r[fin], atol=lse_tol, rtol=lse_tol)
    if causal and tq > tk:
        assert (out[:, :, :tq - tk] == 0).all()


@pytest.mark.parametrize("tq,tk,dtype", [(37, 30, torch.float16), (30, 37, torch.bfloat16), (1, 1, torch.float16),
                                          (40, 40, torch.float32)])
def test_row_sums_by_the_tensor_cores_keep_the_result(monkeypatch, tq, tk, dtype):
    """FwdPlan.sum_mma: the Triton forward launched with SUM_MMA forms each row's sum l as p times a tile of ones
    beside p v: out and the gradients within the float64 tolerances, out and lse within a rounding of the
    reduction's (l then sums the 16-bit p), rows with no key (Tq > Tk) still 0 with lse +inf; refused where
    the consumers lag (ping-pong, the overlap)."""
    summed = dataclasses.replace(SMALL_FWD, sum_mma=True)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    _forward_variant_matches(monkeypatch, summed, "SUM_MMA", tq, tk, dtype, tol, tol)
    for bad in (dict(gluon=2, block_m=128, block_n=64, num_stages=2),
                dict(gluon=1, block_m=128, block_n=64, num_stages=2, overlap=True)):
        with pytest.raises(ValueError, match="sum_mma=True.*free-running"):
            plans.FwdPlan(sum_mma=True, **bad)


@pytest.mark.parametrize("tq,tk,dtype,causal,scale", [  # (the whole tiles of 30x37, 40x40, 48x48: the slow set)
    (37, 30, torch.float16, True, None), pytest.param(30, 37, torch.bfloat16, True, None, marks=pytest.mark.slow),
    (1, 1, torch.float16, True, None), pytest.param(40, 40, torch.float32, True, None, marks=pytest.mark.slow),
    pytest.param(48, 48, torch.bfloat16, True, None, marks=pytest.mark.slow), (33, 41, torch.bfloat16, False, None),
    (32, 32, torch.bfloat16, False, 0.0), (29, 35, torch.float16, True, -0.3)])
def test_one_loop_forward_matches_the_two_loops(monkeypatch, tq, tk, dtype, causal, scale):
    """FwdPlan.one_loop: the masked tiles (causal diagonal, keys past the last whole tile) under a branch inside
    the full tiles' loop give the two-loop kernel's result: out and the gradients within the float64 tolerances,
    out and lse as the two loops' (the same sums in the same order), rows with no key (Tq > Tk) 0 with lse +inf.
    Keys a multiple of the tile (EVEN_K) load without row masks; a scale of 0 or below takes the path that keeps
    the masked -inf out of the scale's product (-inf x 0 is NaN)."""
    merged = dataclasses.replace(SMALL_FWD, one_loop=True)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    _forward_variant_matches(monkeypatch, merged, "ONE_LOOP", tq, tk, dtype, tol, 1e-5, causal, scale)
    for bad in (dict(sum_mma=True), dict(warp_specialize=True),
                dict(gluon=1, block_m=128, block_n=64, num_stages=2)):
        with pytest.raises(ValueError, match="one_loop=True"):
            plans.FwdPlan(one_loop=True, **bad)


@pytest.mark.parametrize("fused", [False, True], ids=["two-launches", "fused"])
# (37, 30), (33, 41) and (1, 1) cover Tq > Tk, no mask and one key; the others (~3.5 s each) are in the slow set
@pytest.mark.parametrize("tq,tk,dtype,causal", [(37, 30, torch.float16, True),
                                                 pytest.param(30, 37, torch.bfloat16, True, marks=pytest.mark.slow),
                                                 pytest.param(48, 48, torch.bfloat16, True, marks=pytest.mark.slow),
                                                 (33, 41, torch.float16, False),
                                                 pytest.param(40, 40, torch.float32, True, marks=pytest.mark.slow),
                                                 (1, 1, torch.float16, True)])
def test_one_loop_backward_matches_the_two_loops(monkeypatch, tq, tk, dtype, causal, fused):
    """BwdPlan.one_loop: the dk/dv programs' diagonal query tiles and the dq programs' diagonal and last key tiles
    masked under a branch inside the full tiles' loop give the two-loop kernels' gradients (the same sums in the
    same order: within a rounding), and within the float64 tolerances; rows with no key (Tq > Tk) get zero gradients. Refused
    where no Triton dk/dv or dq pass runs."""
    bplan = dataclasses.replace(SMALL_BWD, fused=fused)
    merged = dataclasses.replace(bplan, one_loop=True)
    seen = _recorded_launches(monkeypatch, (SMALL_FWD, merged), run=False)
    assert seen[-1][2]["ONE_LOOP"] is True
    assert _recorded_launches(monkeypatch, (SMALL_FWD, bplan), run=False)[-1][2]["ONE_LOOP"] is False
    monkeypatch.undo()
    q, k, v = make_qkv(2, 2, tq, tk, 16, dtype, layout="bthd")
    run_and_compare(q, k, v, causal=causal, plan=(SMALL_FWD, merged))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = launch_fwd(qd, kd, vd, 0.25, causal, SMALL_FWD)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device, out.dtype)
    got = launch_bwd(do, qd, kd, vd, out, lse, 0.25, causal, merged)
    want = launch_bwd(do, qd, kd, vd, out, lse, 0.25, causal, bplan)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, atol=tol * w.abs().max().item(), rtol=tol, msg=name)
    if causal and tq > tk:
        assert (got[0][:, :, :tq - tk] == 0).all()
    for bad in (dict(gluon=2, block_n1=128, block_m1=64, block_m2=128, block_n2=64, num_stages=2),
                dict(gluon=1, block_n1=128, block_m1=64, num_stages=2, dq_mode="tma_add")):
        with pytest.raises(ValueError, match="one_loop=True"):
            plans.BwdPlan(one_loop=True, **bad)
