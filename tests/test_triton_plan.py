"""The Triton method's launch plans: which path each row length, dtype and direction takes, where the
Gluon paths fall back, and the launch arithmetic of the ring and hybrid paths (no GPU needed).

On a CPU the launches run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.runtime import device as runtime_device
from tests.helpers import BWD_TOL, FWD_TOL, random_scores

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_plan_packs_short_rows_splits_long_ones_and_streams_longer_ones():
    short = tp.plan(128, 2)
    assert not short.long and short.rows > 1 and short.block_n == 128
    odd = tp.plan(1000, 2)
    assert not odd.long and odd.block_n == 1024
    long = tp.plan(2**21, 2)
    assert long.long and long.block_n == tp.LONG_BLOCK_N
    tiny = tp.plan(7, 4)
    assert not tiny.long and tiny.rows * tiny.block_n >= 1024
    assert not tp.plan(tp.SPLIT_ABOVE_N, 2).split and not tp.plan(tp.SPLIT_ABOVE_N, 2, backward=True).split
    assert tp.plan(262144, 2).split and tp.plan(262144, 2).block_n == tp.SPLIT_BLOCK_N
    assert tp.plan(65536, 2, backward=True, gluon=False).split
    assert tp.plan(32768, 2, gluon=False).stages  # the forward's fallback: persistent, 16-bit
    bwd = tp.plan(32768, 2, backward=True)  # the backward: one row a program on 32 warps, held 16-bit (run AA)
    assert not bwd.stages and bwd.narrow and (bwd.rows, bwd.num_warps) == (1, 32)
    assert not tp.plan(16384, 2, backward=True).narrow and not tp.plan(32768, 2).narrow
    # rows masked over a quarter of their 16384-column tile or more hold 16-bit values too (run AF)
    assert [tp.plan(n, 2, backward=True).narrow for n in (8192, 8193, 12288, 12289, 16384)] == [
        False, True, True, False, False]
    assert not tp.plan(32768, 4).stages and not tp.plan(1024, 2, causal=True).stages
    widest = tp.MAX_SPLITS * tp.SPLIT_BLOCK_N
    assert tp.plan(widest, 2).split and tp.plan(widest + 1, 2).long  # too many chunks: the long path


def test_plan_takes_the_gluon_paths_for_long_16_bit_rows_and_falls_back_where_they_cannot():
    """16-bit rows, not causal: the hybrid path forward for 16385-65536 columns, the ring path backward
    for 32769-65536; elsewhere (fp32, causal, gluon=False) neither; where they cannot run (here: the
    interpreter), launch_fwd and launch_bwd take the plan for gluon=False and still give the reference
    result; each path is one direction's only."""
    for n in (tp.HYBRID_MIN_N + 8, tp.MAX_TILE_N, tp.MAX_TILE_N + 8, 40000, tp.RING_MAX_N):
        p = tp.plan(n, 2)
        assert p.hybrid and not p.ring and p.num_warps == tp.HYBRID_WARPS
    for n in (tp.MAX_TILE_N + 8, 40000, tp.RING_MAX_N):
        p = tp.plan(n, 2, backward=True)
        assert p.ring and not p.hybrid and p.num_warps == tp.RING_WARPS
    assert tp.HYBRID_MIN_N == tp.HYBRID_REG_VECS * 8 * 32 * tp.HYBRID_WARPS  # (the registers' part, 16-bit)
    assert not tp.plan(tp.HYBRID_MIN_N, 2).hybrid and not tp.plan(tp.MAX_TILE_N, 2, backward=True).ring
    assert not tp.plan(tp.RING_MAX_N + 8, 2).hybrid and not tp.plan(tp.RING_MAX_N + 8, 2, backward=True).ring
    others = [tp.plan(65536, *args) for args in ((4,), (4, True), (2, False, True), (2, True, True))]
    assert not any(p.ring or p.hybrid for p in others)
    assert tp.plan(65536, 2, gluon=False).long and tp.plan(65536, 2, backward=True, gluon=False).split
    x = random_scores((3, 40), torch.bfloat16, DEVICE)
    hp, rp = tp.Plan(False, 64, 1, 1, hybrid=True), tp.Plan(False, 64, 1, 1, ring=True, slots=9)
    if not torch.cuda.is_available():
        assert "GPU" in tp.gluon_unusable(x, False, hp) and "GPU" in tp.gluon_unusable(x, False, rp, x)
    assert "causal" in tp.gluon_unusable(x, True, hp) and "causal" in tp.gluon_unusable(x, True, rp, x)
    y = launch_fwd(x, 0.5, False, hp)
    assert kernels.relative_error(y, kernels.reference_softmax(x, scale=0.5)) <= FWD_TOL[torch.bfloat16]
    dy = random_scores((3, 40), torch.bfloat16, DEVICE)
    dx = launch_bwd(y, dy, 0.5, False, rp)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.5)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="backward path"):
        launch_fwd(x, 0.5, False, rp)
    with pytest.raises(ValueError, match="forward path"):
        launch_bwd(y, dy, 0.5, False, hp)


def test_ring_launch_arithmetic_on_an_h200_sized_gpu(monkeypatch):
    """The ring launches on a GPU of 132 SMs and 227 KB of shared memory per block (no GPU needed):
    the backward's grid is a program pair per row while rows are fewer than half the SMs (5 rows: 5
    pairs, not min(5, 132) // 2 = 2), one program per SM beyond (66 pairs), at least one; the ring
    keeps the plan's 13 slots of 16 KB, fewer where the plan asks for more than fit."""
    from types import SimpleNamespace

    gpu = torch.device("cuda", 0)
    monkeypatch.setitem(runtime_device._DEVICE_PROPS, gpu,
                        SimpleNamespace(multi_processor_count=132, shared_memory_per_block_optin=227 * 1024))
    p = tp.plan(65536, 2, backward=True)
    assert [tp.ring_pairs(r, gpu, p) for r in (1, 5, 65, 66, 67, 131, 2048)] == [1, 5, 65, 66, 66, 66, 66]
    assert 2 * tp.ring_pairs(10**6, gpu, p) <= 132
    assert tp.ring_slots(gpu, p) == tp.RING_SLOTS == 13
    assert tp.ring_slots(gpu, tp.Plan(False, 65536, 1, 32, ring=True, slots=20)) == 14  # (227 - 1) KB // 16 KB


def test_hybrid_launch_arithmetic():
    """The hybrid path's split of a row: 4 vectors per thread in registers (16384 columns at 16 warps),
    the rest in shared memory, partial only in its last vector; none left for rows the registers hold
    alone (gluon_unusable turns those away); the longest row's shared part lets two programs share a
    227 KB SM."""
    p = tp.plan(tp.RING_MAX_N, 2)
    assert tp._hybrid_shape(65536, p) == (4, 12, True) and tp._hybrid_shape(49152, p) == (4, 8, True)
    assert tp._hybrid_shape(40000, p) == (4, 6, False) and tp._hybrid_shape(16392, p) == (4, 1, False)
    assert tp._hybrid_shape(tp.HYBRID_MIN_N, p)[1] == 0
    nr, ns, _ = tp._hybrid_shape(tp.RING_MAX_N, p)
    assert 2 * (ns * 16 * 32 * p.num_warps + 1024) <= 227 * 1024
