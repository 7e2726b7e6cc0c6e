"""The flash backward's dq pass in Gluon for Hopper (plan ``BwdPlan.gluon`` = 2): a program takes 2 x BLOCK_M
queries of one (batch, head), the shared producer of ``bwd_gluon`` (``_producer``, ``_pass_buffers``) loading
each consumer's q and do once and streaming the k and v tiles; the algorithm, the program order and what it
takes are in ``bwd_gluon``'s docstring."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.bwd_gluon import _over_budget, _pass_buffers, _producer, lpt_heads
from kernels.methods.flash.gluon_common import (_key_range, _mask_tile, _query_program, descriptor,
                                             fence_async_shared, gl, gluon, mbarrier, mma_layout, operand_layout,
                                             row_layout, warpgroup_mma, warpgroup_mma_wait)
from kernels.methods.flash.tiles import LOG2E, kv_group
from kernels.runtime import fastlaunch

__all__ = ["launch_dq"]

_dq_consumer = _dq_ws_kernel = None  # (defined below where Gluon is)

if gluon is not None:

    @gluon.jit
    def _dq_consumer(q_bufs, do_bufs, k_bufs, v_bufs, qd_bar, ready, empty, LSE, DELTA, DQ, s_dqb, s_dqh, s_dqm,
                     s_dqd, O, s_ob, s_oh, s_om, s_od, b, h, H, m0, n_tiles, TQ, TK, qk_scale, scale, C: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, DELTA_IN_DQ: gl.constexpr):
        """dq of this consumer's BLOCK_M queries: per key tile s = q k^T and dp = do v^T (both issued,
        then waited for), p = exp2(s * c - lse * log2(e)), ds = p * (dp - delta), dq += ds k. (Waiting for s
        alone and forming p under dp's product compiles to no overlap: ptxas moves the second wait up to the
        first exponential, Triton 3.6.) DELTA_IN_DQ: delta = rowsum(o * do) of these rows formed here (o read
        by pointers before the wait for do, do from its shared tile) and stored for the dk/dv pass, which runs
        after this one (no delta kernel)."""
        dtype: gl.constexpr = q_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_N)
        o_layout: gl.constexpr = mma_layout(D)
        r0 = m0 + C * BLOCK_M
        hi, full = _key_range(r0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
        offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        row = (b * H + h).to(gl.int64) * TQ
        lse2 = gl.load(LSE + row + offs_m, mask=offs_m < TQ, other=float("inf")) * 1.4426950408889634
        if DELTA_IN_DQ:  # (o's rows as 16-byte vectors)
            r_layout: gl.constexpr = row_layout(D)
            o_rows = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, r_layout))
            o_cols = gl.arange(0, D, layout=gl.SliceLayout(0, r_layout))
            o = gl.load(O + b.to(gl.int64) * s_ob + h.to(gl.int64) * s_oh + o_rows[:, None].to(gl.int64) * s_om
                        + o_cols[None, :] * s_od, mask=o_rows[:, None] < TQ, other=0.0)
        else:
            delta = gl.load(DELTA + row + offs_m, mask=offs_m < TQ, other=0.0)
        dq = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(qd_bar.index(C), 0)
        q = q_bufs.index(C).reshape([BLOCK_M, D])
        do = do_bufs.index(C).reshape([BLOCK_M, D])
        if DELTA_IN_DQ:  # (rows past TQ: o masked to 0, do's tile zero-filled by TMA)
            od = gl.sum(o.to(gl.float32) * do.load(r_layout).to(gl.float32), axis=1)
            delta = gl.convert_layout(od, gl.SliceLayout(1, s_layout))
            gl.store(DELTA + row + offs_m, delta, mask=offs_m < TQ)
        for j in range(n_tiles):
            s = j % STAGES
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            n0 = j * BLOCK_N
            if n0 < hi:
                k = k_bufs.index(s).reshape([BLOCK_N, D])
                v = v_bufs.index(s).reshape([BLOCK_N, D])
                sc = warpgroup_mma(q, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dp = warpgroup_mma(do, v.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                sc, dp = warpgroup_mma_wait(num_outstanding=0, deps=(sc, dp))
                z = _mask_tile(sc * qk_scale - lse2[:, None], offs_m, n0, full, TQ, TK, BLOCK_N, CAUSAL)
                ds = gl.exp2(z) * (dp - delta[:, None])
                dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), operand_layout(D)), k, dq, is_async=True)
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            mbarrier.arrive(empty.index(s), count=1)
        rows = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        ptrs = (DQ + b.to(gl.int64) * s_dqb + h.to(gl.int64) * s_dqh + rows[:, None].to(gl.int64) * s_dqm
                + cols[None, :] * s_dqd)
        gl.store(ptrs, (dq * scale).to(dtype), mask=rows[:, None] < TQ)

    @gluon.jit
    def _dq_ws_kernel(desc_q, desc_do, desc_k, desc_v, LSE, DELTA, DQ, s_dqb, s_dqh, s_dqm, s_dqd, O, s_ob, s_oh,
                      s_om, s_od, H, TQ, TK, qk_scale, scale, n_sec, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, DELTA_IN_DQ: gl.constexpr,
                      LPT: gl.constexpr = False, KV_GROUP: gl.constexpr = 1):
        """One program: dq of 2 x BLOCK_M queries of (batch, head); the producer loads q and do once per
        consumer and streams the k and v tiles up to the program's last visible key, heaviest first (with LPT in
        sections of n_sec heads, ``_lpt_program``). DELTA_IN_DQ: the consumers form delta from O (see
        ``_dq_consumer``). KV_GROUP: query heads a kv head (the k and v tiles are kv head h // KV_GROUP's)."""
        b, h, m0, n_tiles = _query_program(TQ, TK, n_sec, H, BLOCK_M, BLOCK_N, CAUSAL, LPT)
        q_bufs, do_bufs, k_bufs, v_bufs, qd_bar, ready, empty = _pass_buffers(desc_q, desc_do, desc_k, desc_v, STAGES)
        fence_async_shared()
        gl.warp_specialize(
            [(_producer, (desc_q, desc_do, desc_k, desc_v, q_bufs, do_bufs, k_bufs, v_bufs, qd_bar, ready, empty, b,
                          h, m0, 0, n_tiles, h // KV_GROUP, BLOCK_M, BLOCK_N, STAGES)),
             (_dq_consumer, (q_bufs, do_bufs, k_bufs, v_bufs, qd_bar, ready, empty, LSE, DELTA, DQ, s_dqb, s_dqh,
                             s_dqm, s_dqd, O, s_ob, s_oh, s_om, s_od, b, h, H, m0, n_tiles, TQ, TK, qk_scale, scale,
                             0, BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, DELTA_IN_DQ)),
             (_dq_consumer, (q_bufs, do_bufs, k_bufs, v_bufs, qd_bar, ready, empty, LSE, DELTA, DQ, s_dqb, s_dqh,
                             s_dqm, s_dqd, O, s_ob, s_oh, s_om, s_od, b, h, H, m0, n_tiles, TQ, TK, qk_scale, scale,
                             1, BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, DELTA_IN_DQ))],
            [4, 4], [240, 240])


def launch_dq(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
              delta: torch.Tensor, dq: torch.Tensor, scale: float, causal: bool, block_m: int, block_n: int,
              stages: int, out: Optional[torch.Tensor] = None, lpt_mb: int = 0,
              launched: Optional[list] = None) -> None:
    """dq (allocated by the caller, any strides) for inputs ``gluon_common.supported`` takes and do; block_m:
    queries per program (two consumers of block_m / 2), block_n: keys per tile, stages: ring slots. out: the
    forward's output (any strides), to form delta = rowsum(out * do) into ``delta`` here (then no delta
    kernel, and the dk/dv pass after this one); None: ``delta`` holds it already. lpt_mb: the programs' order
    (``lpt_heads``: sections of heads whose k and v take at most that many MB; 0 head by head). launched: a
    list the launch (kernel, grid, arguments, meta) is appended to (for a prepared launch of the caller's)."""
    B, H, TQ, D = q.shape
    HKV, TK = k.shape[1], k.shape[2]
    group = kv_group(H, HKV)
    if block_m != 128 or block_n not in (64, 128):
        raise ValueError(f"the Gluon dq kernel takes 128 queries a program (two warpgroups of 64) and 64 or 128 keys "
                         f"a tile; got block_m2={block_m}, block_n2={block_n}")
    why = _over_budget("dq", D, block_n, stages)
    if why:
        raise ValueError(why)
    half = block_m // 2
    o = dq if out is None else out  # (unread without out: any 16-bit tensor of the shape)
    one = (_dq_ws_kernel, (-(-TQ // block_m), H, B),
           (descriptor(q, half), descriptor(do, half), descriptor(k, block_n), descriptor(v, block_n), lse, delta,
            dq, *dq.stride(), o, *o.stride(), H, TQ, TK, scale * LOG2E, scale,
            lpt_heads(lpt_mb, TK, D, v.shape[-1], k.element_size(), B * HKV, group)),
           dict(BLOCK_M=half, BLOCK_N=block_n, D=D, STAGES=stages, CAUSAL=causal, DELTA_IN_DQ=out is not None,
                LPT=lpt_mb > 0, KV_GROUP=group, num_warps=4))
    fastlaunch.launch(*one)
    if launched is not None:
        launched.append(one)
