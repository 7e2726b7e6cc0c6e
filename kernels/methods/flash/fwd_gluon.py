"""The flash forward in Gluon for Hopper (sm_90): warp-specialized, FA3's structure (plan
``FwdPlan.gluon``; the Triton kernel of ``fwd`` elsewhere).

Why it exists: Triton 3.6 compiles the Triton forward's wgmma with a wait right behind each issue, and
a 128-query program's two warpgroups run their softmax at the same time, so the tensor cores idle
through every softmax unless a second program on the SM happens to fill the gap (docs/perf.md,
attention). Here one program takes 2 x BLOCK_M queries of one (batch, head) and splits the work by
warps: a producer (the default partition, 4 warps) loads
the two q tiles once and streams the key and value tiles through a ring of ``STAGES`` shared-memory
slots by TMA (4-D descriptors over (B, H, T, d) with the tensors' own strides: rows past T come back
as zeros); two consumer warpgroups (workers, 240 registers each) each own BLOCK_M queries and run
q k^T, the online softmax and p v for every key tile, releasing a slot when both have read it. With
``PINGPONG`` (plan ``gluon=2``) the consumers take turns on the tensor cores, each turn issuing one
tile's q k^T with the previous tile's p v, so one consumer's softmax runs during the other's wgmmas
(FA3's schedule); without it (``gluon=1``) they run free and the warp schedulers interleave them as
their timing allows.

Per consumer, key tiles before its first diagonal key need no mask; the diagonal tiles and a ragged
last tile get the causal / boundary mask (-inf before the exponential); tiles past its last visible
key are only waited for and released (the producer loads the keys of the program's second half).
Causal work tiles start heaviest first. Output: out in the (B, T, H, d) memory layout and the natural
log-sum-exp per query row, as the Triton forward (a row with no key: out = 0, lse = +inf).

A program takes one work tile (2 x BLOCK_M queries of a (batch, head)), or with ``persistent`` (plan
``FwdPlan.persistent``) one program per SM takes a tile a round (causal: every head's heaviest block
first, then the next lighter ones; the programs in order on even rounds and in reverse on odd ones, so
their loads even out). One
program fits an SM (the consumers' registers), so without it each tile starts with the tensor cores
idle until its q and first key tiles arrive and ends with its stores; persistent, the producer loads
the next tile's q (a second q buffer) and key tiles while the consumers finish this one, and the ring's
slots, phases and ping-pong turns count on across tiles (FA3's persistent kernel, static schedule).

Takes: CUDA capability 9.0 exactly (wgmma), Gluon, bfloat16 / float16, d = dv in {64, 128}, inputs
TMA can read (16-byte aligned bases and strides). ``supported`` says why not; the launcher then runs
the Triton kernel with the table's plan.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.tiles import LOG2E, empty_bthd, interpreter_enabled, tma_eligible
from kernels.methods.triton import fastlaunch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    # TMA's global -> shared copy: async_copy_global_to_shared in Triton 3.6, renamed async_load by 3.9
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    GLUON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - a Triton without Gluon's Hopper module
    gluon = gl = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = fence_async_shared = None
    GluonDescriptor = _tma_load = None
    GLUON_ERROR = f"this Triton has no Gluon Hopper module ({type(exc).__name__}: {exc})"

try:  # the descriptor's fields with defaults (padding, and more in newer Tritons), for _unchecked
    import dataclasses as _dc

    _DESCRIPTOR_CLASS = GluonDescriptor
    _DESCRIPTOR_DEFAULTS = {f.name: f.default for f in _dc.fields(GluonDescriptor) if f.default is not _dc.MISSING}
except Exception:  # pragma: no cover - no Gluon, or a descriptor that is not a dataclass: the checked way
    _DESCRIPTOR_CLASS = _DESCRIPTOR_DEFAULTS = None

HEAD_DIMS = (64, 128)
CONSUMER_REGS = 240  # per consumer thread (setmaxnreg; the producer's warps give theirs up)
SHARED_LIMIT = 227 * 1024  # shared memory one program may opt in to on sm_90


def shared_bytes(d: int, block_n: int, stages: int, persistent: bool = False) -> int:
    """The buffers' shared memory (two 64-query q tiles, twice when persistent; the k and v ring; 16-bit)
    and 1 KB for the barriers and the reductions' scratch."""
    return (2 if persistent else 1) * 2 * 64 * d * 2 + stages * 2 * block_n * d * 2 + 1024


def budget_reason(d: int, block_n: int, stages: int, persistent: bool = False) -> Optional[str]:
    """Why the forward's buffers do not fit a program's shared memory (None: they do)."""
    need = shared_bytes(d, block_n, stages, persistent)
    if need > SHARED_LIMIT:
        return (f"the Gluon forward's shared memory at d={d}, block_n={block_n}, {stages} slots"
                f"{', persistent' if persistent else ''}: {need} bytes, over the {SHARED_LIMIT} an H100/H200 program "
                f"may have")
    return None


# (defined below where Gluon is)
mma_layout = operand_layout = _key_range = _query_program = _ring_barriers = _mask_tile = None

if gluon is not None:

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, n_m, n_bh, H,
                  TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr,
                  CAUSAL: gl.constexpr, LEVELS: gl.constexpr):
        """The program's work tiles one after another: each consumer's q tile into its slot of the tile's q
        buffer (once the consumer released what it held there, Q_BUFS tiles ago), then the key and value
        tiles through the ring; slots and phases count on across work tiles."""
        kv = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, m0, n_tiles = _work_tile(_tile_of(it), n_m, n_bh, H, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL, LEVELS)
            qs = (it % Q_BUFS) * 2
            for c in gl.static_range(2):
                mbarrier.wait(q_empty.index(qs + c), ((it // Q_BUFS) & 1) ^ 1)  # (a fresh buffer passes at once)
                mbarrier.expect(q_bar.index(qs + c), desc_q.block_type.nbytes)
                _tma_load(desc_q, [b, h, m0 + c * BLOCK_M, 0], q_bar.index(qs + c), q_bufs.index(qs + c))
            for j in range(n_tiles):
                s = kv % STAGES
                mbarrier.wait(kv_empty.index(s), ((kv // STAGES) & 1) ^ 1)  # (a fresh slot passes at once)
                bar = kv_ready.index(s)
                mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
                _tma_load(desc_k, [b, h, j * BLOCK_N, 0], bar, k_bufs.index(s))
                _tma_load(desc_v, [b, h, j * BLOCK_N, 0], bar, v_bufs.index(s))
                kv += 1

    @gluon.constexpr_function
    def mma_layout(n):
        """The wgmma accumulator layout of one warpgroup's 64 x n tile."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def operand_layout(n):
        """A 16-bit left operand held in registers, of a product whose accumulator is mma_layout(n)."""
        return gl.DotOperandLayout(operand_index=0, parent=mma_layout(n), k_width=2)

    @gluon.jit
    def _key_range(r0, TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """For queries r0 .. r0 + BLOCK_M: keys [0, full) every one of them sees (no mask), none sees a key
        from hi on (tiles.key_bounds, for these kernels); hi = 0 where all of them lie past Tq (the last
        program's second consumer, one-query shapes: nothing of theirs is stored)."""
        if CAUSAL:
            hi = gl.maximum(gl.minimum(r0 + BLOCK_M + TK - TQ, TK), 0)
            full = gl.maximum(gl.minimum(r0 + TK - TQ + 1, TK), 0) // BLOCK_N * BLOCK_N
        else:
            hi = TK
            full = TK // BLOCK_N * BLOCK_N
        if r0 >= TQ:
            hi = 0
        return hi, full

    @gluon.jit
    def _query_program(TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """A program over 2 x BLOCK_M queries of (batch, head), heaviest first when causal (the last query
        blocks see the most keys): (b, h, its first query m0, the key tiles up to its last visible key)."""
        pid_m = gl.program_id(0)
        h = gl.program_id(1)
        b = gl.program_id(2)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        m0 = pid_m * (2 * BLOCK_M)
        if CAUSAL:
            hi = gl.maximum(gl.minimum(m0 + 2 * BLOCK_M + TK - TQ, TK), 0)
        else:
            hi = TK
        return b, h, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _tile_count(total):
        """How many of `total` work tiles this program takes: the programs take them in rounds of one each,
        the last round partial (see ``_tile_of``)."""
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        full = total // n_prog
        rem = total % n_prog
        if full % 2 == 0:
            last = pid < rem
        else:
            last = pid >= n_prog - rem
        return full + last.to(gl.int32)

    @gluon.jit
    def _tile_of(it):
        """This program's it-th work tile: round it's, the programs in order on even rounds and in reverse on
        odd ones (a snake, so a program that took a heavier tile in one round takes a lighter one in the
        next); a program a tile (num_programs = tiles): its own."""
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        if it % 2 == 0:
            t = it * n_prog + pid
        else:
            t = it * n_prog + n_prog - 1 - pid
        return t

    @gluon.jit
    def _work_tile(t, n_m, n_bh, H, TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                   LEVELS: gl.constexpr):
        """The forward's work tile t of n_m query blocks (2 x BLOCK_M queries) x n_bh (batch, head) pairs: (b, h,
        its first query m0, the key tiles up to its last visible key). Head by head, each head's blocks
        heaviest first when causal (a grid of one tile a program starts them in this order); LEVELS
        (persistent programs, causal): every head's heaviest block, then every head's next, ..., so a
        round of the programs' tiles is of about one weight (the programs' loads stay even)."""
        if LEVELS:
            bh = t % n_bh
            blk = n_m - 1 - t // n_bh
        else:
            bh = t // n_m
            blk = t % n_m
            if CAUSAL:
                blk = n_m - 1 - blk
        m0 = blk * (2 * BLOCK_M)
        if CAUSAL:
            hi = gl.maximum(gl.minimum(m0 + 2 * BLOCK_M + TK - TQ, TK), 0)
        else:
            hi = TK
        return bh // H, bh % H, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _ring_barriers(STAGES: gl.constexpr, FIXED: gl.constexpr = 2):
        """(fixed, ready, empty): a barrier per fixed tile (FIXED: one per consumer, per buffer of them); per ring
        slot one the TMA completes (ready) and one both consumers arrive on when done with the slot (empty)."""
        fixed = gl.allocate_shared_memory(gl.int64, [FIXED, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(FIXED):
            mbarrier.init(fixed.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)  # both consumers release a slot
        return fixed, ready, empty

    @gluon.jit
    def _mask_tile(z, offs_m, n0, full, TQ, TK, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """z (queries x BLOCK_N keys from n0) with -inf where a key is past Tk (TMA read it as zeros) or,
        causal, after the query's last visible key; tiles before `full` need neither and pass as they are."""
        if n0 + BLOCK_N > full:
            offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout(BLOCK_N)))
            keep = offs_n[None, :] < TK
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
            z = gl.where(keep, z, float("-inf"))
        return z

    @gluon.jit
    def _softmax_tile(sc, m_i, l_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N: gl.constexpr,
                      CAUSAL: gl.constexpr):
        """One key tile's online-softmax step from its scores sc: (p, alpha, m, l); a row with no key yet
        keeps m = -inf and adds exactly 0."""
        z = _mask_tile(sc * qk_scale, offs_m, n0, full, TQ, TK, BLOCK_N, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(z, axis=1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp2(-inf) = 0
        p = gl.exp2(z - m_ref[:, None])
        alpha = gl.exp2(m_i - m_ref)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, D: gl.constexpr):
        """out = acc / l in the output's own strides and lse (natural log) for queries r0 .. r0 + BLOCK_M
        below Tq; a row with no key: out 0, lse +inf (the backward's exp(s - lse) is then 0)."""
        o_layout: gl.constexpr = mma_layout(D)
        empty = l_i == 0.0
        lse = gl.where(empty, float("inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout(BLOCK_N)))
        gl.store(LSE + (b * H + h).to(gl.int64) * TQ + offs_m, lse, mask=offs_m < TQ)
        inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))
        rows = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        ptrs = (O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + rows[:, None].to(gl.int64) * som
                + cols[None, :] * sod)
        gl.store(ptrs, (acc * inv[:, None]).to(O.dtype.element_ty), mask=rows[:, None] < TQ)

    @gluon.jit
    def _consumer(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, O, LSE, sob, soh, som, sod, n_m, n_bh,
                  H, TQ, TK, qk_scale, C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
                  LEVELS: gl.constexpr):
        """A consumer running free: per key tile, q k^T, the softmax, p v, each waited for at once; its q
        buffer handed back once its work tile's key tiles are done, then the tile's rows stored."""
        dtype: gl.constexpr = q_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_N)
        o_layout: gl.constexpr = mma_layout(D)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        kv = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, m0, n_tiles = _work_tile(_tile_of(it), n_m, n_bh, H, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL, LEVELS)
            r0 = m0 + C * BLOCK_M
            hi, full = _key_range(r0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
            offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
            qs = (it % Q_BUFS) * 2 + C
            mbarrier.wait(q_bar.index(qs), (it // Q_BUFS) & 1)
            q = q_bufs.index(qs).reshape([BLOCK_M, D])
            for j in range(n_tiles):
                s = (kv + j) % STAGES
                mbarrier.wait(kv_ready.index(s), ((kv + j) // STAGES) & 1)
                n0 = j * BLOCK_N
                if n0 < hi:
                    k = k_bufs.index(s).reshape([BLOCK_N, D])
                    v = v_bufs.index(s).reshape([BLOCK_N, D])
                    sc = warpgroup_mma(q, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
                    p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N,
                                                       CAUSAL)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    acc = warpgroup_mma(gl.convert_layout(p.to(dtype), operand_layout(D)), v, acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(kv_empty.index(s), count=1)
            mbarrier.arrive(q_empty.index(qs), count=1)
            kv += n_tiles
            _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M, BLOCK_N, D)

    @gluon.jit
    def _consumer_pingpong(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, O, LSE, sob, soh, som,
                           sod, n_m, n_bh, H, TQ, TK, qk_scale, C: gl.constexpr, BLOCK_M: gl.constexpr,
                           BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr,
                           CAUSAL: gl.constexpr, LEVELS: gl.constexpr):
        """The consumer with FA3's ping-pong: the two consumers take turns on the tensor cores (mbarriers
        ``turn``: consumer C waits on turn[C], the other arrives on it), and each turn issues this tile's
        q k^T together with the previous tile's p v, so one consumer's softmax runs while the other's
        wgmmas do. Every consumer takes n_tiles + 1 turns a work tile (the last one for the last p v), with
        or without work in them, so the turns alternate to the end (their count g goes on across work
        tiles); a tile's slot is released in the turn after its q k^T, once its p v has run too."""
        dtype: gl.constexpr = q_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_N)
        o_layout: gl.constexpr = mma_layout(D)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        kv = 0
        g = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, m0, n_tiles = _work_tile(_tile_of(it), n_m, n_bh, H, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL, LEVELS)
            r0 = m0 + C * BLOCK_M
            hi, full = _key_range(r0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
            n_mine = gl.minimum((hi + BLOCK_N - 1) // BLOCK_N, n_tiles)  # the tiles this consumer computes: a prefix
            offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
            p_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=operand_layout(D))  # the previous tile's p, for p v
            qs = (it % Q_BUFS) * 2 + C
            mbarrier.wait(q_bar.index(qs), (it // Q_BUFS) & 1)
            q = q_bufs.index(qs).reshape([BLOCK_M, D])
            for t in range(n_tiles + 1):
                s = (kv + t) % STAGES
                if t < n_tiles:
                    mbarrier.wait(kv_ready.index(s), ((kv + t) // STAGES) & 1)
                mbarrier.wait(turn.index(C), ((g + t) & 1) ^ (1 - C))  # (consumer 0's first turn passes at once)
                v_prev = v_bufs.index((kv + t + STAGES - 1) % STAGES).reshape([BLOCK_N, D])
                sc = zero_s
                if t < n_mine:
                    k = k_bufs.index(s).reshape([BLOCK_N, D])
                    if t > 0:
                        sc = warpgroup_mma(q, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                        acc = warpgroup_mma(p_op, v_prev, acc, is_async=True)
                        sc, acc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, acc))
                    else:
                        sc = warpgroup_mma(q, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
                elif t == n_mine and t > 0:  # the last tile's p v
                    acc = warpgroup_mma(p_op, v_prev, acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(turn.index(1 - C), count=1)
                if t > 0:
                    mbarrier.arrive(kv_empty.index((kv + t + STAGES - 1) % STAGES), count=1)
                if t < n_mine:  # this tile's softmax, while the other consumer's turn runs
                    p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, t * BLOCK_N, full, TQ, TK, qk_scale,
                                                       BLOCK_N, CAUSAL)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]  # (after the last p v)
                    p_op = gl.convert_layout(p.to(dtype), operand_layout(D))
            mbarrier.arrive(q_empty.index(qs), count=1)
            kv += n_tiles
            g += n_tiles + 1
            _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M, BLOCK_N, D)

    @gluon.jit
    def _fwd_ws_kernel(desc_q, desc_k, desc_v, O, LSE, sob, soh, som, sod, H, TQ, TK, qk_scale, n_m, n_bh,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, Q_BUFS: gl.constexpr, LEVELS: gl.constexpr):
        """Programs over work tiles of 2 x BLOCK_M queries of one (batch, head) (``_work_tile``): one tile a
        program, or (persistent) a tile a round (``_tile_of``), with Q_BUFS = 2 q buffers so the
        next tile's q loads while this one's run; see the module docstring."""
        dtype: gl.constexpr = desc_q.dtype
        q_bufs = gl.allocate_shared_memory(dtype, [2 * Q_BUFS, 1, 1, BLOCK_M, D], desc_q.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_k.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_v.layout)
        q_bar, kv_ready, kv_empty = _ring_barriers(STAGES, 2 * Q_BUFS)
        q_empty = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2 * Q_BUFS):
            mbarrier.init(q_empty.index(i), count=1)  # (its consumer, done with its q)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # (ping-pong's turns)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()  # (the barriers initialized before any TMA or wait sees them)
        if PINGPONG:
            gl.warp_specialize(
                [(_producer, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty,
                              n_m, n_bh, H, TQ, TK, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, CAUSAL, LEVELS)),
                 (_consumer_pingpong, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, O, LSE, sob,
                                       soh, som, sod, n_m, n_bh, H, TQ, TK, qk_scale, 0, BLOCK_M, BLOCK_N, D,
                                       STAGES, Q_BUFS, CAUSAL, LEVELS)),
                 (_consumer_pingpong, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, O, LSE, sob,
                                       soh, som, sod, n_m, n_bh, H, TQ, TK, qk_scale, 1, BLOCK_M, BLOCK_N, D,
                                       STAGES, Q_BUFS, CAUSAL, LEVELS))],
                [4, 4], [240, 240])  # (CONSUMER_REGS)
        else:
            gl.warp_specialize(
                [(_producer, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty,
                              n_m, n_bh, H, TQ, TK, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, CAUSAL, LEVELS)),
                 (_consumer, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, O, LSE, sob, soh, som, sod,
                              n_m, n_bh, H, TQ, TK, qk_scale, 0, BLOCK_M, BLOCK_N, D, STAGES, Q_BUFS, CAUSAL,
                              LEVELS)),
                 (_consumer, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, O, LSE, sob, soh, som, sod,
                              n_m, n_bh, H, TQ, TK, qk_scale, 1, BLOCK_M, BLOCK_N, D, STAGES, Q_BUFS, CAUSAL,
                              LEVELS))],
                [4, 4], [240, 240])  # (CONSUMER_REGS)


_CAPS: dict = {}


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Gluon forward cannot take these inputs (None: it can)."""
    if GLUON_ERROR:
        return GLUON_ERROR
    if interpreter_enabled() or not q.is_cuda:
        return "the Gluon forward runs on a GPU only (not in Triton's interpreter)"
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if idx not in _CAPS:
        _CAPS[idx] = torch.cuda.get_device_capability(idx)
    if _CAPS[idx] != (9, 0):
        return f"the Gluon forward uses Hopper's wgmma (compute capability 9.0; this GPU has {_CAPS[idx]})"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"the Gluon forward takes bfloat16 or float16 (got {q.dtype})"
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in HEAD_DIMS:
        return f"the Gluon forward takes d = dv in {HEAD_DIMS} (got d={d}, dv={dv})"
    if not tma_eligible(q, k, v):
        return "the Gluon forward reads by TMA: 16-byte aligned bases and strides"
    if not q.numel() or not k.numel():
        return "the Gluon forward takes no empty inputs (TMA descriptors need every dimension >= 1)"
    return None


_LAYOUTS: dict = {}
#: Whether descriptors are made without the dataclass's checks (None: not yet known; the first call compares
#: the two ways). The callers pass only tensors ``supported`` / ``tma_eligible`` took, which is what those
#: checks ask (16-byte aligned base and strides, last stride 1, no empty dimension); the checks cost about
#: 3 us a descriptor on a fast host, and a forward + backward makes seven.
_UNCHECKED: Optional[bool] = None


def _unchecked(t: torch.Tensor, block: list, layout):
    d = object.__new__(_DESCRIPTOR_CLASS)
    d.__dict__.update(_DESCRIPTOR_DEFAULTS)
    d.base, d.shape, d.strides, d.block_shape, d.layout = t, list(t.shape), list(t.stride()), block, layout
    return d


def _descriptor(t: torch.Tensor, rows: int):
    """A 4-D TMA descriptor of a (B, H, T, d) tensor with its strides (16-bit, or the backward's fp32 dq sums),
    boxes of one (batch, head)'s rows x d (its shared-memory layout made once per box and dtype)."""
    global _UNCHECKED
    block = [1, 1, rows, t.shape[-1]]
    key = (rows, t.shape[-1], t.dtype)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(
            block, {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[t.dtype])
    if _UNCHECKED and _DESCRIPTOR_DEFAULTS is not None:
        return _unchecked(t, block, layout)
    checked = GluonDescriptor(t, list(t.shape), list(t.stride()), block, layout)
    if _UNCHECKED is None:  # (a Triton whose descriptor is not a plain dataclass keeps the checked way)
        try:
            _UNCHECKED = _unchecked(t, list(block), layout) == checked
        except Exception:
            _UNCHECKED = False
    return checked


_SMS: dict = {}


def launch_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, block_m: int,
               block_n: int, stages: int, pingpong: bool = True, persistent: bool = False,
               programs: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse as ``fwd.launch_fwd`` (inputs ``supported`` takes); block_m: queries per work tile (two
    consumers of block_m / 2), block_n: keys per tile, stages: ring slots; pingpong: the consumers take
    turns on the tensor cores (``_consumer_pingpong``), else they run free (``_consumer``); persistent: one
    program per SM (at most), each taking a work tile a round (``_tile_of``; causal: heaviest blocks of
    every head first), the next tile's q and first key tiles loading while one runs; else a program a tile.
    programs: at most this many persistent programs (None: the GPU's SM count)."""
    why = budget_reason(q.shape[-1], block_n, stages, persistent)
    if why:
        raise ValueError(why)
    if block_m != 128 or block_n not in (64, 128):
        raise ValueError(f"the Gluon forward takes 128 queries a program (two warpgroups of 64) and 64 or 128 keys "
                         f"a tile; got block_m={block_m}, block_n={block_n}")
    B, H, TQ, D = q.shape
    TK = k.shape[2]
    out = empty_bthd(B, H, TQ, D, q.dtype, q.device)
    lse = torch.empty((B, H, TQ), dtype=torch.float32, device=q.device)
    half = block_m // 2
    n_m = -(-TQ // block_m)
    tiles = n_m * B * H
    if persistent:
        cap = programs
        if cap is None:
            idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
            if idx not in _SMS:
                _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
            cap = _SMS[idx]
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"programs={programs!r}: the persistent programs' count, an int >= 1")
        programs = min(tiles, cap)
    elif programs is not None:
        raise ValueError(f"programs={programs!r} is for persistent=True (a program a work tile otherwise)")
    else:
        programs = tiles
    fastlaunch.launch(
        _fwd_ws_kernel, (programs,),
        (_descriptor(q, half), _descriptor(k, block_n), _descriptor(v, block_n), out, lse, *out.stride(), H, TQ, TK,
         scale * LOG2E, n_m, B * H),
        dict(BLOCK_M=half, BLOCK_N=block_n, D=D, STAGES=stages, CAUSAL=causal, PINGPONG=pingpong,
             Q_BUFS=2 if persistent else 1, LEVELS=persistent and causal, num_warps=4))
    return out, lse
