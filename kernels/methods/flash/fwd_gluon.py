"""The flash forward in Gluon for Hopper (sm_90): warp-specialized, FA3's structure (plan
``FwdPlan.gluon``; the Triton kernel of ``fwd`` elsewhere).

Why it exists: Triton 3.6 compiles the Triton forward's wgmma with a wait right behind each issue, and
a 128-query program's two warpgroups run their softmax at the same time, so the tensor cores idle
through every softmax unless a second program on the SM happens to fill the gap (docs/perf.md,
attention). Here one program takes CONSUMERS x BLOCK_M queries (BLOCK_M = 64) of one (batch, head) and
splits the work by warps: a producer (the default partition, 4 warps) loads the consumers' q tiles once
and streams the key and value tiles through a ring of ``STAGES`` shared-memory slots by TMA (4-D
descriptors over (B, H, T, d) with the tensors' own strides: rows past T come back as zeros); the
consumer warpgroups (workers: two of 240 registers each, or three of 160) each own BLOCK_M queries and
run q k^T, the online softmax and p v for every key tile, releasing a slot when all have read it.

How the consumers order their products (plan ``gluon`` and ``overlap``):
- ``gluon=1`` (``_consumer``): each runs free, q k^T, softmax, p v, each product waited for at once; the warp
  schedulers interleave the two consumers as their timing allows (they wait on the same ring slots, so their
  softmaxes tend to run at the same time).
- ``overlap`` (``_consumer_lagged``): p v lags a tile behind, issued right after the next tile's q k^T; the
  consumer waits for the q k^T alone and runs that tile's softmax while its p v runs (FA3's intra-warpgroup
  overlap).
- ``gluon=2`` (``_consumer_lagged``, ping-pong): the consumers also take turns at issuing, each passing the turn
  as soon as its products are issued (FA3's warp-scheduler barrier), so the tensor cores run one consumer's
  products queued behind the other's while the other's softmax runs. (A ping-pong that passes the turn only
  once its products have finished idles the tensor cores at every hand-off: slower than free-running everywhere.)
Scores of tiles every query sees whole take one FMA each before the exponential (scale and max folded; the
Triton forward's SCALE_NONNEG).
With ``sum_mma`` (free-running consumers) each row's sum l comes from the tensor cores, p times a shared
BLOCK_N x 16 tile of ones issued beside p v and waited for with it, in place of a thread's adds and shuffles of
p (a reduction a tile): l then sums the 16-bit p that p v multiplies, so the output's normalization matches its
numerator, and lse = m + log(l) lies within 2^-9 of the fp32 sum's. Measured on an H100 (docs/perf.md):
+1.6-3.5% with 128-key tiles at d = 64 (the table's entry beyond T = 1024), -1.1% with d = 128's 64-key tiles.
With ``block_m=192`` three consumer warpgroups of 160 registers share the program (FA3's head-dim-64 shape;
at d = 128 with 64-key tiles only, whose scores take half the registers of 128-key ones): a 192-query work
tile, each key tile read once for three warpgroups' queries, and one more warpgroup's products to fill the
tensor cores while the others run their softmax; ping-pong turns then go round the three.

Per consumer, key tiles before its first diagonal key need no mask; the diagonal tiles and a ragged
last tile get the causal / boundary mask (-inf before the exponential); tiles past its last visible
key are only waited for and released (the producer loads the keys of the program's last consumer).
Causal work tiles start heaviest first. Output: out in the (B, T, H, d) memory layout and the natural
log-sum-exp per query row, as the Triton forward (a row with no key: out = 0, lse = +inf).

A program takes one work tile (CONSUMERS x BLOCK_M queries of a (batch, head)), or with ``persistent`` (plan
``FwdPlan.persistent``) one program per SM takes a tile a round (causal: every head's heaviest block
first, then the next lighter ones; the programs in order on even rounds and in reverse on odd ones, so
their loads even out). With ``FwdPlan.section_mb`` the causal order goes through the heads a section at a
time, a section's keys and values at most that many MB, so they stay in L2 while its tiles run (FA3's L2
swizzle): level by level over every head, each query block reads its keys and values from memory again
once the heads' keys and values outgrow L2 (at (8, 16, 2048, 128), 128 MB against the H100's 50; Nsight
Compute saw 2.6 TB/s of DRAM reads and 18% L2 hits, and 32 MB sections took the forward +17-21%; at the
d = 64 shapes, 48 MB of heads, they bought at most 3% and cost up to 27%: measured on an H100, docs/perf.md). One
program fits an SM (the consumers' registers), so without it each tile starts with the tensor cores
idle until its q and first key tiles arrive and ends with its stores; persistent, the producer loads
the next tile's q (a second q buffer) and key tiles while the consumers finish this one, and the ring's
slots, phases and ping-pong turns count on across tiles (FA3's persistent kernel, static schedule).

Where the code is: the consumers in ``fwd_gluon_consumers``, the work-tile schedule in ``fwd_gluon_schedule``;
here the producer, the program (``_fwd_ws_kernel``) and its launcher.

Grouped-query attention (k and v with H / G heads): query head h reads kv head h // G, which the producer
loads instead of head h (the work tiles of a group's heads run one after another, so their keys and values are
read from L2 after the first); ``section_mb`` counts a kv head once for its G query heads.

Takes: CUDA capability 9.0 exactly (wgmma), Gluon, bfloat16 / float16, d = dv in {64, 128}, inputs
TMA can read (16-byte aligned bases and strides). ``supported`` says why not; the launcher then runs
the Triton kernel with the table's plan.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.fwd_gluon_consumers import _consumer_of
from kernels.methods.flash.fwd_gluon_schedule import _tile_count, _tile_of, _work_tile
from kernels.methods.flash.gluon_common import (CONSUMER_REGS_3, GLUON_ERROR, SHARED_LIMIT, descriptor, _ring_barriers,
                                                _tma_load, fence_async_shared, gl, gluon, mbarrier, supported)
from kernels.methods.flash.plan import check_section_mb
from kernels.methods.flash.tiles import LOG2E, empty_bthd, kv_group
from kernels.runtime import fastlaunch
from kernels.runtime.device import device_props

__all__ = ["GLUON_ERROR", "budget_reason", "launch_fwd", "section_heads", "shared_bytes", "supported"]


def shared_bytes(d: int, block_n: int, stages: int, persistent: bool = False, consumers: int = 2,
                 sum_mma: bool = False) -> int:
    """The buffers' shared memory (a 64-query q tile per consumer, twice when persistent; the k and v ring;
    with sum_mma the block_n x 16 tile of ones; 16-bit) and 1 KB for the barriers and the reductions' scratch."""
    return ((2 if persistent else 1) * consumers * 64 * d * 2 + stages * 2 * block_n * d * 2
            + (block_n * 16 * 2 if sum_mma else 0) + 1024)


def section_heads(section_mb: int, tk: int, d: int, dv: int, itemsize: int, n_bh: int, group: int = 1) -> int:
    """Heads a section of the persistent causal tile order holds (``_work_tile``): as many as have keys and values
    within section_mb MB (at least one, at most n_bh); section_mb = 0: every head (n_bh). group: query heads a kv
    head (grouped-query attention): n_bh then counts (batch, kv head) pairs and the result their query heads, whole
    groups."""
    check_section_mb(section_mb)
    if section_mb == 0:
        return n_bh * group
    return max(1, min(n_bh, (section_mb << 20) // (max(tk, 1) * (d + dv) * itemsize))) * group


def budget_reason(d: int, block_n: int, stages: int, persistent: bool = False, block_m: int = 128,
                  sum_mma: bool = False) -> Optional[str]:
    """Why the forward's buffers or registers do not fit a program (None: they do). block_m: the work tile's
    queries, 64 a consumer warpgroup (192: three consumers of 160 registers, which hold d = 64's accumulator and
    scores, or d = 128's with 64-key tiles: 64 + 32 fp32 and 16 for p a thread)."""
    consumers = block_m // 64
    if consumers == 3 and d != 64 and not (d == 128 and block_n == 64):
        return (f"the Gluon forward's three consumers (block_m=192) have {CONSUMER_REGS_3} registers a thread, which "
                f"hold d = 64's accumulator and scores, or d = 128's with 64-key tiles (got d={d}, block_n={block_n}; "
                f"block_n=64 or block_m=128 takes it)")
    need = shared_bytes(d, block_n, stages, persistent, consumers, sum_mma)
    if need > SHARED_LIMIT:
        return (f"the Gluon forward's shared memory at d={d}, block_n={block_n}, {stages} slots"
                f"{', persistent' if persistent else ''}: {need} bytes, over the {SHARED_LIMIT} an H100/H200 program "
                f"may have")
    return None


if gluon is not None:

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, n_m, n_bh,
                  n_sec, H, TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr, LEVELS: gl.constexpr, CONSUMERS: gl.constexpr,
                  KV_GROUP: gl.constexpr):
        """The program's work tiles one after another: each consumer's q tile into its slot of the tile's q
        buffer (once the consumer released what it held there, Q_BUFS tiles ago), then the key and value
        tiles (of kv head h // KV_GROUP) through the ring; slots and phases count on across work tiles."""
        kv = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, m0, n_tiles = _work_tile(_tile_of(it), n_m, n_bh, n_sec, H, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL, LEVELS,
                                           CONSUMERS)
            qs = (it % Q_BUFS) * CONSUMERS
            for c in gl.static_range(CONSUMERS):
                mbarrier.wait(q_empty.index(qs + c), ((it // Q_BUFS) & 1) ^ 1)  # (a fresh buffer passes at once)
                mbarrier.expect(q_bar.index(qs + c), desc_q.block_type.nbytes)
                _tma_load(desc_q, [b, h, m0 + c * BLOCK_M, 0], q_bar.index(qs + c), q_bufs.index(qs + c))
            for j in range(n_tiles):
                s = kv % STAGES
                mbarrier.wait(kv_empty.index(s), ((kv // STAGES) & 1) ^ 1)  # (a fresh slot passes at once)
                bar = kv_ready.index(s)
                mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
                _tma_load(desc_k, [b, h // KV_GROUP, j * BLOCK_N, 0], bar, k_bufs.index(s))
                _tma_load(desc_v, [b, h // KV_GROUP, j * BLOCK_N, 0], bar, v_bufs.index(s))
                kv += 1

    @gluon.jit
    def _fwd_ws_kernel(desc_q, desc_k, desc_v, O, LSE, sob, soh, som, sod, H, TQ, TK, qk_scale, n_m, n_bh, n_sec,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, Q_BUFS: gl.constexpr, LEVELS: gl.constexpr,
                       OVERLAP: gl.constexpr = False, SCALE_NONNEG: gl.constexpr = False, CONSUMERS: gl.constexpr = 2,
                       SUM_MMA: gl.constexpr = False, KV_GROUP: gl.constexpr = 1):
        """Programs over work tiles of CONSUMERS x BLOCK_M queries of one (batch, head) (``_work_tile``): one
        tile a program, or (persistent) a tile a round (``_tile_of``), with Q_BUFS = 2 q buffers so the next
        tile's q loads while this one's run; CONSUMERS (2, or 3 at 160 registers each) consumer warpgroups
        (``_consumer_of``: free-running, or with PINGPONG or OVERLAP lagged); KV_GROUP query heads a kv head
        (grouped-query attention: k and v have H / KV_GROUP heads); see the module docstring."""
        dtype: gl.constexpr = desc_q.dtype
        q_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS * Q_BUFS, 1, 1, BLOCK_M, D], desc_q.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_k.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_v.layout)
        q_bar, kv_ready, kv_empty = _ring_barriers(STAGES, CONSUMERS * Q_BUFS, CONSUMERS)
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS * Q_BUFS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS * Q_BUFS):
            mbarrier.init(q_empty.index(i), count=1)  # (its consumer, done with its q)
        turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())  # (ping-pong's turns)
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(turn.index(i), count=1)
        if SUM_MMA:  # (the row sums' right operand: a tile of ones, for every consumer)
            ones = gl.allocate_shared_memory(dtype, [BLOCK_N, 16], gl.NVMMASharedLayout.get_default_for([BLOCK_N, 16],
                                                                                                        dtype))
            ones.store(gl.full([BLOCK_N, 16], 1.0, dtype, layout=gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])))
        else:
            ones = q_bufs  # (unread)
        fence_async_shared()  # (the barriers initialized before any TMA or wait sees them)
        # (each consumer count spells its partition list out: Gluon 3.6 takes the list as a literal of the call and
        # cannot hold a kernel function in a list variable, so the lists cannot be built in a static_range loop;
        # nor can the arguments be shared tuples: a tuple held in a variable passes its constexprs as int32)
        if CONSUMERS == 3:
            gl.warp_specialize(
                [(_producer, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty,
                              n_m, n_bh, n_sec, H, TQ, TK, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, CAUSAL, LEVELS,
                              CONSUMERS, KV_GROUP)),
                 (_consumer_of, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE,
                                 sob, soh, som, sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, 0, BLOCK_M, BLOCK_N, D,
                                 STAGES, Q_BUFS, CAUSAL, LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS, SUM_MMA)),
                 (_consumer_of, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE,
                                 sob, soh, som, sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, 1, BLOCK_M, BLOCK_N, D,
                                 STAGES, Q_BUFS, CAUSAL, LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS, SUM_MMA)),
                 (_consumer_of, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE,
                                 sob, soh, som, sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, 2, BLOCK_M, BLOCK_N, D,
                                 STAGES, Q_BUFS, CAUSAL, LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS, SUM_MMA))],
                [4, 4, 4], [160, 160, 160])  # (CONSUMER_REGS_3)
        else:
            gl.warp_specialize(
                [(_producer, (desc_q, desc_k, desc_v, q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty,
                              n_m, n_bh, n_sec, H, TQ, TK, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, CAUSAL, LEVELS,
                              CONSUMERS, KV_GROUP)),
                 (_consumer_of, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE,
                                 sob, soh, som, sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, 0, BLOCK_M, BLOCK_N, D,
                                 STAGES, Q_BUFS, CAUSAL, LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS, SUM_MMA)),
                 (_consumer_of, (q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE,
                                 sob, soh, som, sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, 1, BLOCK_M, BLOCK_N, D,
                                 STAGES, Q_BUFS, CAUSAL, LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS, SUM_MMA))],
                [4, 4], [240, 240])  # (CONSUMER_REGS)


def launch_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, block_m: int,
               block_n: int, stages: int, pingpong: bool = True, persistent: bool = False,
               programs: Optional[int] = None, overlap: bool = False,
               section_mb: int = 0, sum_mma: bool = False,
               launched: Optional[list] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse as ``fwd.launch_fwd`` (inputs ``supported`` takes); block_m: queries per work tile (128:
    two consumer warpgroups of 64; 192: three, d = 64, or d = 128 with block_n=64), block_n: keys per tile,
    stages: ring slots; pingpong: the consumers take turns at issuing their products (``_consumer_lagged``),
    else they run free; overlap: each consumer's softmax runs while its previous tile's p v does
    (``_consumer_lagged``), else each product is waited for at once (``_consumer`` where free-running);
    persistent: one program per SM (at most), each taking a work tile a round (``_tile_of``; causal: heaviest
    blocks first, in sections of heads whose keys and values take at most section_mb MB, 0: every head in
    one section; ``section_heads``), the next tile's q and first key tiles loading while one runs; else a
    program a tile. programs: at most this many persistent programs (None: the GPU's SM count). sum_mma (free-running
    consumers): the row sums by the tensor cores (``_consumer``). launched: a list the launch (kernel, grid,
    arguments, meta) is appended to (for a prepared launch of the caller's)."""
    if block_m not in (128, 192) or block_n not in (64, 128) or stages < 2:
        raise ValueError(f"the Gluon forward takes 128 or 192 queries a work tile (two or three warpgroups of 64), 64 "
                         f"or 128 keys a tile and 2 or more ring slots (its consumers hold one slot while the next "
                         f"fills); got block_m={block_m}, block_n={block_n}, stages={stages}")
    if sum_mma and (pingpong or overlap):
        raise ValueError("sum_mma (the row sums by the tensor cores) is the free-running consumers' (pingpong=False, "
                         "overlap=False)")
    why = budget_reason(q.shape[-1], block_n, stages, persistent, block_m, sum_mma)
    if why:
        raise ValueError(why)
    B, H, TQ, D = q.shape
    HKV, TK = k.shape[1], k.shape[2]
    group = kv_group(H, HKV)
    out = empty_bthd(B, H, TQ, D, q.dtype, q.device)
    lse = torch.empty((B, H, TQ), dtype=torch.float32, device=q.device)
    half = 64  # (a consumer warpgroup's queries)
    n_m = -(-TQ // block_m)
    tiles = n_m * B * H
    if persistent:
        cap = programs
        if cap is None:
            idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
            cap = device_props(torch.device("cuda", idx)).multi_processor_count
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"programs={programs!r}: the persistent programs' count, an int >= 1")
        programs = min(tiles, cap)
    elif programs is not None:
        raise ValueError(f"programs={programs!r} is for persistent=True (a program a work tile otherwise)")
    else:
        programs = tiles
    one = (_fwd_ws_kernel, (programs,),
           (descriptor(q, half), descriptor(k, block_n), descriptor(v, block_n), out, lse, *out.stride(), H, TQ, TK,
            scale * LOG2E, n_m, B * H, section_heads(section_mb, TK, D, v.shape[-1], q.element_size(), B * HKV, group)),
           dict(BLOCK_M=half, BLOCK_N=block_n, D=D, STAGES=stages, CAUSAL=causal, PINGPONG=pingpong,
                Q_BUFS=2 if persistent else 1, LEVELS=persistent and causal, OVERLAP=overlap, SCALE_NONNEG=scale >= 0,
                CONSUMERS=block_m // 64, SUM_MMA=sum_mma, KV_GROUP=group, num_warps=4))
    fastlaunch.launch(*one)
    if launched is not None:
        launched.append(one)
    return out, lse
