"""The flash backward in Gluon for Hopper (sm_90): the dk/dv pass (plan ``BwdPlan.gluon`` = 1, the
dq pass then the Triton one of ``bwd``, or none: with ``dq_mode="tma_add"`` the dk/dv pass adds dq
itself) and the dq pass too (``gluon`` = 2); warp-specialized like the Gluon forward. The delta kernel
stays the Triton one, unless the Gluon dq pass forms delta itself (``BwdPlan.delta_in_dq``, then run first).

Both passes share one producer partition (the default one, 4 warps): it loads each consumer's fixed
tiles once and streams the other two tensors' tiles by TMA (4-D descriptors with the tensors' strides;
rows past T read as zeros) through a ring of ``STAGES`` shared-memory slots, released when both
consumer warpgroups have read them.

* dk/dv: a program takes 2 x BLOCK_N keys of one (batch, head); the fixed tiles are each consumer's k
  and v, the streamed ones q and do, from the first query tile any of its keys is seen from. Per query
  tile each consumer runs the transposed recurrence of ``bwd._dkdv_inner``: s^T = k q^T, p^T =
  exp2(s^T * scale * log2(e) - lse * log2(e)) (-inf first above the causal diagonal), dv += p^T do,
  dp^T = v do^T, ds^T = p^T * (dp^T - delta), dk += ds^T q. Tiles before a consumer's first visible
  query are waited for and released only. Keys past Tk are computed and not stored.
* dk/dv adding dq (``DQ``; FA3's backward, five matmuls per tile instead of the two passes' seven): per
  query tile both consumers also put their ds^T in shared memory, and the two take turns (even tiles
  consumer 0, odd ones consumer 1) forming the tile's dq share over all 128 keys (two wgmmas reading
  ds^T transposed) and adding it into an fp32 (B, H, Tq, d) buffer by one TMA reduction
  (``cp.reduce.async.bulk.tensor``), which the host then casts into dq. One reduction per 128 keys and
  query tile: half the reduction traffic of 64-key tiles, which is what cost the Triton kernel's
  ``tma_add`` its place (docs/perf.md). The summation order of dq varies from run to run: under
  ``torch.use_deterministic_algorithms`` the dq pass runs instead. With ``DQ_SPLIT`` (plan ``dq_split``)
  both consumers form a share every tile, each of half of dq's columns (FA3's split of the dq product across
  its warpgroups): a 64 x d/2 accumulator a consumer instead of the turn's 64 x d (64 registers a thread
  at d = 128), two reductions of half a row each, and no consumer idles while the other takes a turn.
  d = 128 only: the halves are column slices of the k tiles at their 64-column swizzle atoms.
* dq (``bwd_gluon_dq``): a program takes 2 x BLOCK_M queries (heaviest first when causal); the fixed tiles are each
  consumer's q and do, the streamed ones k and v, up to the program's last visible key. Per key tile:
  s = q k^T and dp = do v^T, p = exp2(s * scale * log2(e) - lse * log2(e)) (masked as in the
  forward), ds = p * (dp - delta), dq += ds k. With ``delta_in_dq`` each consumer first forms its rows'
  delta = rowsum(o * do) (o read by pointers, do from its fixed tile) and stores it for the dk/dv pass.

Both passes' programs start heaviest first, head by head, or (``BwdPlan.lpt_mb``, ``_lpt_program``) in sections of
heads whose streamed tiles fit in L2, every head's heaviest block of a section first: FA3's LPT order, where the grid's
last programs are its lightest, not the last head's lightest after its heaviest. Measured on an H100 (docs/perf.md),
forward + backward at (4, 12, 4096, 64): 32 MB sections 339 -> 347-349 TFLOP/s, 16 MB with the overlap 358-359
against the overlap alone 350-352 (+2-3%, where a model of the grid's last wave predicted up to 9%); at
(8, 16, 2048, 128) they lost 2-5%.

Grouped-query attention (k and v with H / G heads, G = ``KV_GROUP``): a dk/dv program takes 2 x BLOCK_N keys of
one kv head and streams the query tiles of its G query heads one head after another, summing their
contributions in its accumulators (no atomics, no expanded k and v; dq's shares go to each query head's rows);
its grid has the kv heads on axis 1. A dq program reads the keys and values of its query head's kv head.

Rows past Tq get lse = +inf (p = 0). dk, dv, dq (dk and dq times scale) go out in the tensors' own
strides (the (B, T, H, d) memory layout). Takes what the Gluon forward takes (``gluon_common.supported``):
capability 9.0, 16-bit, d = dv in {64, 128}, inputs TMA can read; plus do.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.fwd_gluon import section_heads
from kernels.methods.flash.gluon_common import (GLUON_ERROR, SHARED_LIMIT, descriptor, _lpt_program, _ring_barriers,
                                             _tma_load, fence_async_shared, gl, gluon, mbarrier, mma_layout,
                                             operand_layout, tma, warpgroup_mma, warpgroup_mma_wait)
from kernels.methods.flash.tiles import LOG2E, kv_group
from kernels.runtime import fastlaunch

__all__ = ["GLUON_ERROR", "budget_reason", "launch_dkdv", "lpt_heads", "shared_bytes"]


def shared_bytes(d: int, tile_rows: int, stages: int, dq: bool = False, dq_split: bool = False) -> int:
    """Either pass's buffers (16-bit): each consumer's two fixed 64-row tiles (dk/dv: k and v; dq: q and do),
    the ring of two tensors' tiles of tile_rows (dk/dv: q and do; dq: k and v), 1 KB of barriers and scratch;
    dq (the dk/dv pass adding dq): two tiles' ds^T of both consumers (16-bit, 64 keys x tile_rows each) and
    each consumer's fp32 dq tile (tile_rows x d, or x d / 2 with dq_split) for its TMA reductions."""
    extra = 2 * 2 * 64 * tile_rows * 2 + 2 * tile_rows * (d // 2 if dq_split else d) * 4 if dq else 0
    return 2 * 2 * 64 * d * 2 + stages * 2 * tile_rows * d * 2 + extra + 1024


def lpt_heads(lpt_mb: int, rows: int, d: int, dv: int, itemsize: int, n_bh: int, group: int = 1) -> int:
    """Heads a section of a pass's LPT program order holds (``BwdPlan.lpt_mb``, ``_lpt_program``): as many as have
    the tiles the pass streams (rows x (d + dv) values: the dk/dv pass's q and do, the dq pass's k and v) within
    lpt_mb MB, at least one, at most n_bh; lpt_mb = 0: one (head by head, each head's heaviest blocks first). group:
    as for ``section_heads`` (the dq pass's query heads, whole groups of a kv head)."""
    return group if lpt_mb == 0 else section_heads(lpt_mb, rows, d, dv, itemsize, n_bh, group)


def _over_budget(what: str, d: int, tile_rows: int, stages: int, dq: bool = False,
                 dq_split: bool = False) -> Optional[str]:
    need = shared_bytes(d, tile_rows, stages, dq, dq_split)
    if need > SHARED_LIMIT:
        return (f"the Gluon {what} kernel's shared memory at d={d}, {tile_rows}-row tiles, {stages} slots: {need} "
                f"bytes, over the {SHARED_LIMIT} an H100/H200 program may have")
    return None


#: dq_split's halves are column slices of the k tiles, which wgmma reads only whole swizzle atoms of (64 16-bit
#: columns, 128 bytes): d = 128 splits at the atoms' boundary, d = 64 would split inside its one atom
_SPLIT_D = ("dq_split takes d = 128 (each consumer's half of dq reads whole 64-column swizzle atoms of the k tiles; "
            "got d={d})")


def budget_reason(d: int, plan, add_dq: Optional[bool] = None) -> Optional[str]:
    """Why a backward plan's Gluon kernels do not fit a program's shared memory (None: they do); add_dq:
    whether the dk/dv kernel adds dq (None: as the plan says; False under deterministic algorithms)."""
    add_dq = plan.dq_mode == "tma_add" if add_dq is None else add_dq
    if add_dq and plan.dq_split and d != 128:
        return _SPLIT_D.format(d=d)
    return (_over_budget("dk/dv", d, plan.block_m1, plan.num_stages, add_dq, plan.dq_split)
            or (_over_budget("dq", d, plan.block_n2, plan.dq_stages) if plan.gluon == 2 else None))


# (defined below where Gluon is; the producer and buffers are bwd_gluon_dq's too)
_pass_buffers = _producer = _dkdv_ws_kernel = None

if gluon is not None:

    @gluon.jit
    def _pass_buffers(desc_a, desc_b, desc_x, desc_y, STAGES: gl.constexpr):
        """Either pass's shared buffers, in ``_producer``'s names: each consumer's tile of a and of b (one box
        of desc_a / desc_b each), STAGES ring slots of x and y tiles, and the barriers (``_ring_barriers``)."""
        a_bufs = gl.allocate_shared_memory(desc_a.dtype, [2] + desc_a.block_type.shape, desc_a.layout)
        b_bufs = gl.allocate_shared_memory(desc_b.dtype, [2] + desc_b.block_type.shape, desc_b.layout)
        x_bufs = gl.allocate_shared_memory(desc_x.dtype, [STAGES] + desc_x.block_type.shape, desc_x.layout)
        y_bufs = gl.allocate_shared_memory(desc_y.dtype, [STAGES] + desc_y.block_type.shape, desc_y.layout)
        fixed, ready, empty = _ring_barriers(STAGES)
        return a_bufs, b_bufs, x_bufs, y_bufs, fixed, ready, empty

    @gluon.jit
    def _producer(desc_a, desc_b, desc_x, desc_y, a_bufs, b_bufs, x_bufs, y_bufs, fixed_bar, ready, empty, b, h,
                  fixed0, lo, n_tiles, h_x, FIXED_ROWS: gl.constexpr, TILE_ROWS: gl.constexpr, STAGES: gl.constexpr,
                  GROUP: gl.constexpr = 1):
        """Both passes' producer: each consumer's tiles of a and b (head h, rows fixed0 + c * FIXED_ROWS), once,
        then the tiles of x and y (head h_x) from row lo on, TILE_ROWS at a time, through the ring; with GROUP > 1
        the n_tiles tiles of heads h_x, h_x + 1, ..., h_x + GROUP - 1 in turn (slots and phases counting on).
        dk/dv: a, b = k, v of a kv head and x, y = q, do of its GROUP query heads; dq: a, b = q, do and
        x, y = k, v of its kv head (GROUP = 1)."""
        for c in gl.static_range(2):
            mbarrier.expect(fixed_bar.index(c), desc_a.block_type.nbytes + desc_b.block_type.nbytes)
            _tma_load(desc_a, [b, h, fixed0 + c * FIXED_ROWS, 0], fixed_bar.index(c), a_bufs.index(c))
            _tma_load(desc_b, [b, h, fixed0 + c * FIXED_ROWS, 0], fixed_bar.index(c), b_bufs.index(c))
        for t in range(GROUP * n_tiles):
            if GROUP == 1:
                hx = h_x
                j = t
            else:
                g = t // n_tiles
                hx = h_x + g
                j = t - g * n_tiles
            s = t % STAGES
            mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)  # (a fresh slot passes at once)
            bar = ready.index(s)
            mbarrier.expect(bar, desc_x.block_type.nbytes + desc_y.block_type.nbytes)
            _tma_load(desc_x, [b, hx, lo + j * TILE_ROWS, 0], bar, x_bufs.index(s))
            _tma_load(desc_y, [b, hx, lo + j * TILE_ROWS, 0], bar, y_bufs.index(s))

    # TMA's shared -> global reduction (cp.reduce.async.bulk.tensor .add): tma.async_atomic_add in newer Tritons;
    # Triton 3.6's Gluon builds the same op through its builder, without a Python wrapper
    _tma_add = getattr(tma, "async_atomic_add", None)
    if _tma_add is None:
        from triton._C.libtriton import ir as _ir
        from triton.experimental.gluon.language._core import builtin as _builtin

        @_builtin
        def _tma_add(tensor_desc, coord, src, _semantic=None):
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)

    @gluon.jit
    def _scores_t(st, qk_scale, lse2, offs_n, offs_m, m0, k0, off, TK, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  DQ: gl.constexpr):
        """The exponent of p^T for a tile's s^T (keys x queries): s^T * scale * log2(e) - lse * log2(e), -inf above
        the causal diagonal and, adding dq, at keys past Tk."""
        z = st * qk_scale - lse2[None, :]
        if CAUSAL:
            if m0 < k0 + BLOCK_N - off:  # a diagonal tile: -inf above it (exp2 of such a score may overflow)
                z = gl.where(offs_n[:, None] <= offs_m[None, :] + off, z, float("-inf"))
        if DQ:  # keys past Tk (read as zeros): p = exp(-lse) may overflow, and inf x 0 would reach dq
            if k0 + BLOCK_N > TK:
                z = gl.where(offs_n[:, None] < TK, z, float("-inf"))
        return z

    @gluon.jit
    def _consumer(k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE, DELTA, DK, DV,
                  s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd, b, h, H, n0, lo, n_tiles, TQ, TK,
                  qk_scale, scale, ds_bufs, dq_bufs, ds_full, ds_empty, desc_dqa, C: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, DQ: gl.constexpr, OVERLAP: gl.constexpr, DQ_SPLIT: gl.constexpr, n_sec,
                  LPT: gl.constexpr, KV_GROUP: gl.constexpr = 1):
        """dk and dv of this consumer's BLOCK_N keys of kv head h (summed over the KV_GROUP query heads
        h * KV_GROUP, ..., whose query tiles come one head after another; H counts query heads); with DQ also dq's
        shares (``_dq_turn``; the arguments
        from ds_bufs to desc_dqa are DQ's buffers, barriers and descriptor, not read without it). Per query
        tile: s^T, then p^T and dv's product with dp^T, then ds^T and dk's product, each waited for at once;
        with OVERLAP dp^T is issued with s^T and each wait is for the product needed next (p^T's exponentials
        run under dp^T, ds^T under dv's product). delta is loaded as the tile starts in a compact layout and
        spread over the accumulator's columns (16 values a thread) only where ds^T needs it: held spread, its 16
        registers beside dk's, dv's, s^T's and dp^T's made the d = 128 pass spill 56 bytes a thread (80 with the
        overlap), reloaded every tile; spread late, 8 bytes either way, outside the loop (compile_check,
        Triton 3.6)."""
        dtype: gl.constexpr = k_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_M)  # keys x queries
        o_layout: gl.constexpr = mma_layout(D)  # keys x d
        a_layout: gl.constexpr = operand_layout(D)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
        compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # (a query tile's values, one a thread)

        k0 = n0 + C * BLOCK_N
        off = TK - TQ
        if CAUSAL:  # the tile holding the first query that sees key k0 (tiles before it: nothing to add)
            j_first = (gl.maximum(k0 - off, 0) - lo) // BLOCK_M
        else:
            j_first = 0
        if k0 >= TK:  # (the last program's second half past Tk: nothing of its to compute)
            j_first = n_tiles
        offs_n = k0 + gl.arange(0, BLOCK_N, layout=row_s)
        row = (b * H + h * KV_GROUP).to(gl.int64) * TQ
        qh = h * KV_GROUP
        dk = gl.zeros([BLOCK_N, D], gl.float32, layout=o_layout)
        dv = gl.zeros([BLOCK_N, D], gl.float32, layout=o_layout)
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
        mbarrier.wait(kv_bar.index(C), 0)
        if DQ:  # (the dq turns read the other consumer's k tile too)
            mbarrier.wait(kv_bar.index(1 - C), 0)
        k = k_bufs.index(C).reshape([BLOCK_N, D])
        v = v_bufs.index(C).reshape([BLOCK_N, D])
        for t in range(KV_GROUP * n_tiles):
            if KV_GROUP == 1:
                j = t
            else:  # (query head qh's tile j: the producer's order)
                g = t // n_tiles
                j = t - g * n_tiles
                qh = h * KV_GROUP + g
                row = (b * H + qh).to(gl.int64) * TQ
            s = t % STAGES
            m0 = lo + j * BLOCK_M
            offs_m = m0 + gl.arange(0, BLOCK_M, layout=col_s)
            # (lse and delta do not wait for the slot: their loads are in flight while it fills; delta, needed only
            # after dp^T, waits one value a thread, not the 16 of the queries a thread's accumulator columns hold
            # (``_consumer``))
            lse2 = gl.load(LSE + row + offs_m, mask=offs_m < TQ, other=float("inf")) * 1.4426950408889634
            offs_c = m0 + gl.arange(0, BLOCK_M, layout=compact)
            delta_c = gl.load(DELTA + row + offs_c, mask=offs_c < TQ, other=0.0)
            mbarrier.wait(ready.index(s), (t // STAGES) & 1)
            if DQ:  # this tile's ds^T slot: free once the dq turn (or with DQ_SPLIT both shares) of tile t - 2 read it
                mbarrier.wait(ds_empty.index(t % 2), ((t // 2) & 1) ^ 1)
            dst = zero_s  # (a tile before j_first adds nothing to dq either)
            if j >= j_first:
                q = q_bufs.index(s).reshape([BLOCK_M, D])
                do = do_bufs.index(s).reshape([BLOCK_M, D])
                if OVERLAP:  # dp^T issued with s^T: the exponentials run under it, ds^T under dv's product
                    st_f = warpgroup_mma(k, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    dpt_f = warpgroup_mma(v, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    st = warpgroup_mma_wait(num_outstanding=1, deps=(st_f,))
                    pt = gl.exp2(_scores_t(st, qk_scale, lse2, offs_n, offs_m, m0, k0, off, TK, BLOCK_N, CAUSAL, DQ))
                    pt_op = gl.convert_layout(pt.to(dtype), a_layout)
                    dv_f = warpgroup_mma(pt_op, do, dv, is_async=True)
                    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt_f,))  # (issued before dv's: done first)
                    delta = gl.convert_layout(delta_c, col_s)
                    dst = pt * (dpt - delta[None, :])
                    dst_op = gl.convert_layout(dst.to(dtype), a_layout)
                    dk_f = warpgroup_mma(dst_op, q, dk, is_async=True)
                    dv, dk, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv_f, dk_f, pt_op, dst_op))
                else:
                    st = warpgroup_mma(k, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
                    pt = gl.exp2(_scores_t(st, qk_scale, lse2, offs_n, offs_m, m0, k0, off, TK, BLOCK_N, CAUSAL, DQ))
                    dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do, dv, is_async=True)
                    dpt = warpgroup_mma(v, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    dv, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt))
                    delta = gl.convert_layout(delta_c, col_s)
                    dst = pt * (dpt - delta[None, :])
                    dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), a_layout), q, dk, is_async=True)
                    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
            mbarrier.arrive(empty.index(s), count=1)
            if DQ:
                _dq_turn(dst.to(dtype), k_bufs, ds_bufs, dq_bufs, ds_full, ds_empty, desc_dqa, b, qh, m0, t, scale, C,
                         BLOCK_N, BLOCK_M, D, DQ_SPLIT)
        if DQ:  # (the last reduction reads its shared tile before the program ends)
            tma.store_wait(0)
        if not DQ:  # (b and h again, from the program's place: not held across the loop, where nothing reads them)
            b, h, _ = _lpt_program(n_sec, H // KV_GROUP, LPT)
        rows = k0 + gl.arange(0, BLOCK_N, layout=row_o)
        cols = gl.arange(0, D, layout=col_o)
        keep = rows[:, None] < TK
        r64 = rows[:, None].to(gl.int64)
        gl.store(DK + b.to(gl.int64) * s_dkb + h.to(gl.int64) * s_dkh + r64 * s_dkn + cols[None, :] * s_dkd,
                 (dk * scale).to(dtype), mask=keep)
        gl.store(DV + b.to(gl.int64) * s_dvb + h.to(gl.int64) * s_dvh + r64 * s_dvn + cols[None, :] * s_dvd,
                 dv.to(dtype), mask=keep)

    @gluon.jit
    def _dq_turn(dst, k_bufs, ds_bufs, dq_bufs, ds_full, ds_empty, desc_dqa, b, h, m0, t, scale, C: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, D: gl.constexpr, DQ_SPLIT: gl.constexpr):
        """dq's share of the query tile at rows m0 of query head h, the t-th tile of the program's stream (t picks
        the slots), from the program's 2 x BLOCK_N keys, FA3's way: each consumer puts its
        ds^T (BLOCK_N keys x BLOCK_M queries; zeros where it had nothing to add) in the tile's shared slot
        ds_bufs[2 * (t % 2) + C] and arrives on ds_full[t % 2]; the consumer whose turn it is (C = t % 2)
        waits for both, runs dq = ds_0 k_0 + ds_1 k_1 (two wgmmas reading ds^T transposed from shared
        memory), hands the slots back (ds_empty) and adds dq * scale into the fp32 dq rows by one TMA
        reduction from its own shared tile, once its previous reduction has read that tile. One reduction
        per 2 x BLOCK_N keys and query tile. DQ_SPLIT: every tile both consumers wait for both ds^T and each
        forms and adds columns C * D / 2 .. (C + 1) * D / 2 of the share (both hand the slots back: ds_empty
        counts two)."""
        par = t % 2
        ds_bufs.index(2 * par + C).store(dst)
        fence_async_shared()  # (the stores seen by the wgmmas, which read through the async proxy)
        mbarrier.arrive(ds_full.index(par), count=1)
        if DQ_SPLIT:
            HALF: gl.constexpr = D // 2
            mbarrier.wait(ds_full.index(par), (t // 2) & 1)
            zero_q = gl.zeros([BLOCK_M, HALF], gl.float32, layout=mma_layout(HALF))
            k_0 = k_bufs.index(0).reshape([BLOCK_N, D]).slice(C * HALF, HALF, dim=1)
            k_1 = k_bufs.index(1).reshape([BLOCK_N, D]).slice(C * HALF, HALF, dim=1)
            dq = warpgroup_mma(ds_bufs.index(2 * par).permute((1, 0)), k_0, zero_q, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_bufs.index(2 * par + 1).permute((1, 0)), k_1, dq, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            mbarrier.arrive(ds_empty.index(par), count=1)
            tma.store_wait(0)  # (this consumer's previous reduction has read its tile)
            dq_bufs.index(C).reshape([BLOCK_M, HALF]).store(dq * scale)
            fence_async_shared()
            _tma_add(desc_dqa, [b, h, m0, C * HALF], dq_bufs.index(C))
        elif par == C:
            mbarrier.wait(ds_full.index(par), (t // 2) & 1)
            zero_q = gl.zeros([BLOCK_M, D], gl.float32, layout=mma_layout(D))
            dq = warpgroup_mma(ds_bufs.index(2 * par).permute((1, 0)), k_bufs.index(0).reshape([BLOCK_N, D]), zero_q,
                               use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_bufs.index(2 * par + 1).permute((1, 0)), k_bufs.index(1).reshape([BLOCK_N, D]), dq,
                               is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            mbarrier.arrive(ds_empty.index(par), count=1)
            tma.store_wait(0)  # (this consumer's previous reduction has read its tile)
            dq_bufs.index(C).reshape([BLOCK_M, D]).store(dq * scale)
            fence_async_shared()
            _tma_add(desc_dqa, [b, h, m0, 0], dq_bufs.index(C))

    @gluon.jit
    def _dkdv_ws_kernel(desc_k, desc_v, desc_q, desc_do, LSE, DELTA, DK, DV,
                        s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd, H, TQ, TK, qk_scale, scale, n_sec,
                        desc_dqa, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                        CAUSAL: gl.constexpr, DQ: gl.constexpr, OVERLAP: gl.constexpr = False,
                        DQ_SPLIT: gl.constexpr = False, LPT: gl.constexpr = False, KV_GROUP: gl.constexpr = 1):
        """One program: 2 x BLOCK_N keys of (batch, kv head), with the query tiles of its KV_GROUP query heads
        (grouped-query attention; H counts query heads, the grid's axis 1 the kv heads); see the module docstring. DQ: dq's shares too,
        added into the fp32 (B, H, Tq, D) rows desc_dqa describes (boxes of BLOCK_M x D, or BLOCK_M x D / 2
        with DQ_SPLIT: each consumer half the columns, ``_dq_turn``); without it desc_dqa is not read.
        OVERLAP: see ``_consumer``. The programs start heaviest first (the first keys see the most queries when
        causal), with LPT in sections of n_sec heads (``_lpt_program``)."""
        b, h, blk = _lpt_program(n_sec, H // KV_GROUP, LPT)
        n0 = blk * (2 * BLOCK_N)
        if CAUSAL:  # the first query tile any of the program's keys is seen from
            lo = gl.maximum(n0 - (TK - TQ), 0) // BLOCK_M * BLOCK_M
        else:
            lo = 0
        n_tiles = gl.maximum(TQ - lo + BLOCK_M - 1, 0) // BLOCK_M
        dtype: gl.constexpr = desc_q.dtype
        k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty = _pass_buffers(desc_k, desc_v, desc_q, desc_do, STAGES)
        if DQ:  # two tiles' ds^T of both consumers, each consumer's dq tile, the ds^T slots' barriers
            ds_bufs = gl.allocate_shared_memory(dtype, [4, BLOCK_N, BLOCK_M],
                                                gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
            dq_bufs = gl.allocate_shared_memory(gl.float32, [2] + desc_dqa.block_type.shape, desc_dqa.layout)
            ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(2):
                mbarrier.init(ds_full.index(i), count=2)  # both consumers' ds^T
                mbarrier.init(ds_empty.index(i), count=2 if DQ_SPLIT else 1)  # who read them: the turn's, or both
        else:  # (placeholders of the consumers' DQ arguments, never read)
            ds_bufs, dq_bufs, ds_full, ds_empty = k_bufs, k_bufs, kv_bar, kv_bar
        fence_async_shared()
        gl.warp_specialize(
            [(_producer, (desc_k, desc_v, desc_q, desc_do, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, b,
                          h, n0, lo, n_tiles, h * KV_GROUP, BLOCK_N, BLOCK_M, STAGES, KV_GROUP)),
             (_consumer, (k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE, DELTA, DK, DV, s_dkb, s_dkh,
                          s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd, b, h, H, n0, lo, n_tiles, TQ, TK, qk_scale, scale,
                          ds_bufs, dq_bufs, ds_full, ds_empty, desc_dqa, 0, BLOCK_N, BLOCK_M, D, STAGES, CAUSAL, DQ,
                          OVERLAP, DQ_SPLIT, n_sec, LPT, KV_GROUP)),
             (_consumer, (k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE, DELTA, DK, DV, s_dkb, s_dkh,
                          s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd, b, h, H, n0, lo, n_tiles, TQ, TK, qk_scale, scale,
                          ds_bufs, dq_bufs, ds_full, ds_empty, desc_dqa, 1, BLOCK_N, BLOCK_M, D, STAGES, CAUSAL, DQ,
                          OVERLAP, DQ_SPLIT, n_sec, LPT, KV_GROUP))],
            [4, 4], [240, 240])


def launch_dkdv(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, scale: float, causal: bool, block_n: int,
                block_m: int, stages: int, dq_acc: Optional[torch.Tensor] = None, overlap: bool = False,
                dq_split: bool = False, lpt_mb: int = 0, launched: Optional[list] = None) -> None:
    """dk and dv (allocated by the caller, any strides) for inputs ``gluon_common.supported`` takes and do;
    block_n: keys per program (two consumers of block_n / 2), block_m: queries per tile, stages: slots.
    dq_acc: a zeroed contiguous fp32 (B, H, Tq, d) tensor to add dq * scale into (dq by TMA reductions,
    64-query tiles), or None (no dq). overlap: each product waited for only where needed next (``_consumer``).
    dq_split: with dq_acc, both consumers add half of dq's columns every tile (``_dq_turn``). lpt_mb: the
    programs' order (``lpt_heads``: sections of heads whose q and do take at most that many MB; 0 head by head).
    launched: as for ``launch_dq``."""
    B, H, TQ, D = q.shape
    HKV, TK = k.shape[1], k.shape[2]
    group = kv_group(H, HKV)
    if block_n != 128 or block_m not in (32, 64):
        raise ValueError(f"the Gluon dk/dv kernel takes 128 keys a program (two warpgroups of 64) and 32 or 64 "
                         f"queries a tile; got block_n1={block_n}, block_m1={block_m}")
    if dq_acc is not None and (block_m != 64 or dq_acc.dtype != torch.float32 or tuple(dq_acc.shape) != (B, H, TQ, D)
                               or not dq_acc.is_contiguous()):
        raise ValueError(f"the Gluon dk/dv kernel adds dq with 64-query tiles (block_m1={block_m}) into a contiguous "
                         f"fp32 {(B, H, TQ, D)} tensor (got {dq_acc.dtype} {tuple(dq_acc.shape)})")
    if dq_split and dq_acc is None:
        raise ValueError("dq_split=True splits the dq the Gluon dk/dv kernel adds: it needs dq_acc")
    if dq_split and D != 128:
        raise ValueError(_SPLIT_D.format(d=D))
    why = _over_budget("dk/dv", D, block_m, stages, dq_acc is not None, dq_split)
    if why:
        raise ValueError(why)
    half = block_n // 2
    desc_k = descriptor(k, half)
    one = (_dkdv_ws_kernel, (-(-TK // block_n), HKV, B),
           (desc_k, descriptor(v, half), descriptor(q, block_m), descriptor(do, block_m), lse, delta,
            dk, dv, *dk.stride(), *dv.stride(), H, TQ, TK, scale * LOG2E, scale,
            lpt_heads(lpt_mb, group * TQ, D, do.shape[-1], q.element_size(), B * HKV),
            desc_k if dq_acc is None else descriptor(dq_acc, block_m, D // 2 if dq_split else D)),
           dict(BLOCK_N=half, BLOCK_M=block_m, D=D, STAGES=stages, CAUSAL=causal, DQ=dq_acc is not None,
                KV_GROUP=group, OVERLAP=overlap, DQ_SPLIT=dq_split, LPT=lpt_mb > 0, num_warps=4))
    fastlaunch.launch(*one)
    if launched is not None:
        launched.append(one)
