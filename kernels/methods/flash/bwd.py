"""The flash backward kernels and their launcher (the algorithm is in the package docstring).

delta = rowsum(o * do) first (one small kernel, which also zeroes the fp32 dq sums of the modes that add
dq, below; or, ``BwdPlan.delta_in_dq``, formed by the dq pass, which then runs first), then dk/dv (a
program per BLOCK_N1 keys, looping
over the queries that see them) and dq (a program per BLOCK_M2 queries, looping over the keys they
see), each recomputing P = exp(scale * q k^T - lse) tile by tile; two launches, or one when the plan
fuses them (the first programs of the grid do dk/dv, the rest dq). No T x T tensor.

``dq_mode="atomic"`` (a plan switch, FA2's structure): no dq pass. The dk/dv programs, which already
hold dS for each (key block, query block) tile, also form dq's share dS k there and add it into an
fp32 (B, H, Tq, d_pad) buffer with atomic adds; one cast writes dq at the end. Five matmuls per tile pair
instead of seven (the dq pass recomputes q k^T and do v^T), for B H Tq Tk / BLOCK_N1 x d fp32 atomics
and a nondeterministic summation order of dq (each add is exact to fp32 rounding; the order varies):
under ``torch.use_deterministic_algorithms(True)`` such a plan runs the dq pass instead.
``dq_mode="tma_add"`` (FA3's structure): the same shares, each tile added by one TMA reduction
(``cp.reduce.async.bulk.tensor`` through a host tensor descriptor of the buffer: the tile goes through
shared memory, the adds happen in L2, the registers and issue slots of the element atomics are free).
Triton's interpreter has no descriptor reductions: there, and on GPUs without TMA, it runs "atomic".
In the Triton kernels both lost to the dq pass, measured on an H200 (docs/perf.md): the sweep tries
them, no table entry uses them. With a Gluon plan (``BwdPlan.gluon``) ``dq_mode="tma_add"`` is the Gluon
dk/dv kernel adding dq (bwd_gluon: both consumers' shares in one reduction per 128 keys): the table's
backward for d = 64 beyond T = 1024.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels.methods.flash import bwd_gluon, bwd_gluon_dq, gluon_common, replay
from kernels.methods.flash import plan as plans
from kernels.methods.flash.fwd import group_kwargs, precision, resolve_tma
from kernels.methods.flash.tiles import (LOG2E, TMA_CODE, device_descriptor, empty_grad, ensure_allocator,
                                         host_descriptor, interpreter_enabled, key_bounds, load_rows, mma,
                                         query_bounds, store_rows, tl, tma_eligible, triton)
from kernels.runtime import fastlaunch

if triton is not None:

    @triton.jit
    def _delta_kernel(O, DO, DELTA, DQA, sob, soh, som, sod, sdb, sdh, sdm, sdd, H, TQ,
                      DV: tl.constexpr, DV_PAD: tl.constexpr, BLOCK: tl.constexpr, ACC_D: tl.constexpr):
        """delta = rowsum(o * do); ACC_D > 0: the same rows of DQA, the dq sums the dk/dv programs add
        into (contiguous fp32 (B, H, Tq, ACC_D)), zeroed here (no memset launch of their own)."""
        m0 = tl.program_id(0) * BLOCK
        h = tl.program_id(1)
        b = tl.program_id(2)
        o = load_rows(O, b, h, m0, TQ, sob, soh, som, sod, BLOCK, DV, DV_PAD, 0, True).to(tl.float32)
        do = load_rows(DO, b, h, m0, TQ, sdb, sdh, sdm, sdd, BLOCK, DV, DV_PAD, 0, True).to(tl.float32)
        rows = m0 + tl.arange(0, BLOCK)
        row0 = (b * H + h).to(tl.int64) * TQ
        tl.store(DELTA + row0 + rows, tl.sum(o * do, 1), mask=rows < TQ)
        if ACC_D > 0:
            cols = tl.arange(0, ACC_D)
            tl.store(DQA + (row0 + rows)[:, None] * ACC_D + cols[None, :], tl.zeros([BLOCK, ACC_D], tl.float32),
                     mask=(rows < TQ)[:, None])

    @triton.jit
    def _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQA, b, h, lo, hi, offs_n, H, TQ, TK, qk_scale, scale,
                    sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd,
                    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
                    WARP_SPEC: tl.constexpr, PREC: tl.constexpr, DQ_ATOMIC: tl.constexpr, mask_end=0):
        """Queries lo .. hi into dk, dv (transposed tiles: keys along the rows). Rows past Tq read
        q = do = 0 and lse = +inf, so they add exactly 0; MASKED applies the causal mask (1: to every
        tile; 2: to the tiles before ``mask_end``, under a branch the whole program takes alike, so one
        pipelined loop covers the diagonal and the full tiles: ``BwdPlan.one_loop``). DQ_ATOMIC:
        also scale * dS k into the fp32 rows of DQA ((B H Tq) x D_PAD), by element atomic adds (1) or,
        DQA a descriptor of that buffer as (B, H, Tq, D_PAD) with (1, 1, BLOCK_M, D_PAD) boxes, one TMA
        reduction per tile (2; rows past Tq fall outside the descriptor's bounds and are not written)."""
        row = (b * H + h).to(tl.int64) * TQ
        for m0 in tl.range(lo, hi, BLOCK_M, warp_specialize=WARP_SPEC):
            m0 = tl.multiple_of(m0, BLOCK_M)
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q = load_rows(Q, b, h, m0, TQ, sqb, sqh, sqm, sqd, BLOCK_M, D, D_PAD, TMA, True)
            lse2 = tl.load(LSE + row + offs_m, mask=offs_m < TQ, other=float("inf")) * 1.4426950408889634
            s_t = mma(k, tl.trans(q), None, PREC)  # (BLOCK_N, BLOCK_M)
            z_t = s_t * qk_scale - lse2[None, :]
            if MASKED == 1:  # -inf before the exponential: masked scores may exceed lse (exp2 would overflow)
                z_t = tl.where(offs_n[:, None] <= offs_m[None, :] + (TK - TQ), z_t, float("-inf"))
            elif MASKED == 2:
                if m0 < mask_end:
                    z_t = tl.where(offs_n[:, None] <= offs_m[None, :] + (TK - TQ), z_t, float("-inf"))
            p_t = tl.math.exp2(z_t)
            do = load_rows(DO, b, h, m0, TQ, sdb, sdh, sdm, sdd, BLOCK_M, DV, DV_PAD, TMA, True)
            dv = mma(p_t.to(do.dtype), do, dv, PREC)
            delta = tl.load(DELTA + row + offs_m, mask=offs_m < TQ, other=0.0)
            dp_t = mma(v, tl.trans(do), None, PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = mma(ds_t.to(q.dtype), q, dk, PREC)
            if DQ_ATOMIC != 0:  # keys past Tk (read as zeros, their p = exp(-lse) unbounded): none of dq's share
                ds_t = tl.where(offs_n[:, None] < TK, ds_t, 0.0)
                dq_part = mma(tl.trans(ds_t.to(k.dtype)), k, None, PREC) * scale  # (BLOCK_M, D_PAD)
                if DQ_ATOMIC == 1:
                    cols = tl.arange(0, D_PAD)
                    ptrs = DQA + (row + offs_m)[:, None] * D_PAD + cols[None, :]
                    tl.atomic_add(ptrs, dq_part, mask=(offs_m[:, None] < TQ) & (cols[None, :] < D), sem="relaxed")
                else:
                    DQA.atomic_add([b, h, m0, 0], dq_part.reshape([1, 1, BLOCK_M, D_PAD]))
        return dk, dv

    @triton.jit
    def _dkdv_program(pid_n, b, h, Q, K, V, DO, DK, DV_, LSE, DELTA, DQA,
                      sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                      s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd,
                      B, H, TQ, TK, qk_scale, scale,
                      D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      TMA: tl.constexpr, WARP_SPEC: tl.constexpr, PREC: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                      ONE_LOOP: tl.constexpr, KV_GROUP: tl.constexpr = 1):
        """dk, dv of BLOCK_N keys of kv head h: loaded once, the gradients summed on chip over the KV_GROUP
        query heads that read them (grouped-query attention; 1: head h alone), no atomics."""
        HKV = H // KV_GROUP
        if TMA == 2:
            Q = device_descriptor(Q, B, H, TQ, sqb, sqh, sqm, BLOCK_M, D, D_PAD)
            DO = device_descriptor(DO, B, H, TQ, sdb, sdh, sdm, BLOCK_M, DV, DV_PAD)
            K = device_descriptor(K, B, HKV, TK, skb, skh, skn, BLOCK_N, D, D_PAD)
            V = device_descriptor(V, B, HKV, TK, svb, svh, svn, BLOCK_N, DV, DV_PAD)
            DK = device_descriptor(DK, B, HKV, TK, s_dkb, s_dkh, s_dkn, BLOCK_N, D, D_PAD)
            DV_ = device_descriptor(DV_, B, HKV, TK, s_dvb, s_dvh, s_dvn, BLOCK_N, DV, DV_PAD)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, b, h, n0, TK, skb, skh, skn, skd, BLOCK_N, D, D_PAD, TMA, True)
        v = load_rows(V, b, h, n0, TK, svb, svh, svn, svd, BLOCK_N, DV, DV_PAD, TMA, True)
        dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
        dv = tl.zeros([BLOCK_N, DV_PAD], tl.float32)
        lo, full = query_bounds(n0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
        for g in range(KV_GROUP):  # (one trip at KV_GROUP = 1: folded away, qh = h)
            qh = h * KV_GROUP + g
            if CAUSAL and ONE_LOOP:
                dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQA, b, qh, lo, TQ, offs_n, H, TQ, TK,
                                     qk_scale, scale, sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd, D, DV, D_PAD, DV_PAD,
                                     BLOCK_M, 2, TMA, WARP_SPEC, PREC, DQ_ATOMIC, full)
            else:
                if CAUSAL:
                    dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQA, b, qh, lo, full, offs_n, H, TQ,
                                         TK, qk_scale, scale, sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd, D, DV, D_PAD,
                                         DV_PAD, BLOCK_M, 1, TMA, WARP_SPEC, PREC, DQ_ATOMIC)
                dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQA, b, qh, full, TQ, offs_n, H, TQ, TK,
                                     qk_scale, scale, sqb, sqh, sqm, sqd, sdb, sdh, sdm, sdd, D, DV, D_PAD, DV_PAD,
                                     BLOCK_M, 0, TMA, WARP_SPEC, PREC, DQ_ATOMIC)
        store_rows(DK, (dk * scale).to(k.dtype), b, h, n0, TK, s_dkb, s_dkh, s_dkn, s_dkd, BLOCK_N, D, D_PAD, TMA)
        store_rows(DV_, dv.to(v.dtype), b, h, n0, TK, s_dvb, s_dvh, s_dvn, s_dvd, BLOCK_N, DV, DV_PAD, TMA)

    @triton.jit
    def _dq_inner(dq, q, do, lse2, delta, K, V, b, h, lo, hi, offs_m, TQ, TK, qk_scale,
                  skb, skh, skn, skd, svb, svh, svn, svd,
                  D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
                  WARP_SPEC: tl.constexpr, PREC: tl.constexpr, mask_from=0, EVEN_K: tl.constexpr = False):
        """Keys lo .. hi into dq. MASKED 1: the causal and key-end mask on every tile; 2: on the tiles from
        ``mask_from`` on, under a branch the whole program takes alike (``BwdPlan.one_loop``; EVEN_K: Tk a
        multiple of BLOCK_N, no load needs a row mask)."""
        for n0 in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
            n0 = tl.multiple_of(n0, BLOCK_N)
            rows_masked: tl.constexpr = MASKED == 1 or (MASKED == 2 and not EVEN_K)
            k = load_rows(K, b, h, n0, TK, skb, skh, skn, skd, BLOCK_N, D, D_PAD, TMA, rows_masked)
            v = load_rows(V, b, h, n0, TK, svb, svh, svn, svd, BLOCK_N, DV, DV_PAD, TMA, rows_masked)
            s = mma(q, tl.trans(k), None, PREC)
            z = s * qk_scale - lse2[:, None]
            if MASKED == 1:
                offs_n = n0 + tl.arange(0, BLOCK_N)
                keep = offs_n[None, :] < TK
                if CAUSAL:
                    keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
                z = tl.where(keep, z, float("-inf"))
            elif MASKED == 2:
                if n0 >= mask_from:
                    offs_n = n0 + tl.arange(0, BLOCK_N)
                    keep = offs_n[None, :] < TK
                    if CAUSAL:
                        keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
                    z = tl.where(keep, z, float("-inf"))
            p = tl.math.exp2(z)
            dp = mma(do, tl.trans(v), None, PREC)
            ds = p * (dp - delta[:, None])
            dq = mma(ds.to(k.dtype), k, dq, PREC)
        return dq

    @triton.jit
    def _dq_program(pid_m, b, h, Q, K, V, DO, DQ, LSE, DELTA, O,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                    s_dqb, s_dqh, s_dqm, s_dqd, sob, soh, som, sod, B, H, TQ, TK, qk_scale, scale,
                    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                    TMA: tl.constexpr, WARP_SPEC: tl.constexpr, PREC: tl.constexpr, DELTA_IN_DQ: tl.constexpr,
                    ONE_LOOP: tl.constexpr, EVEN_K: tl.constexpr, KV_GROUP: tl.constexpr = 1):
        """dq of BLOCK_M queries of head h (its keys and values: kv head h // KV_GROUP). DELTA_IN_DQ: delta =
        rowsum(o * do) of those rows formed here (o read by pointers) and stored for the dk/dv pass, which
        runs after this one (no delta kernel)."""
        hk = h // KV_GROUP
        if TMA == 2:
            Q = device_descriptor(Q, B, H, TQ, sqb, sqh, sqm, BLOCK_M, D, D_PAD)
            DO = device_descriptor(DO, B, H, TQ, sdb, sdh, sdm, BLOCK_M, DV, DV_PAD)
            K = device_descriptor(K, B, H // KV_GROUP, TK, skb, skh, skn, BLOCK_N, D, D_PAD)
            V = device_descriptor(V, B, H // KV_GROUP, TK, svb, svh, svn, BLOCK_N, DV, DV_PAD)
            DQ = device_descriptor(DQ, B, H, TQ, s_dqb, s_dqh, s_dqm, BLOCK_M, D, D_PAD)
        m0 = pid_m * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row = (b * H + h).to(tl.int64) * TQ
        q = load_rows(Q, b, h, m0, TQ, sqb, sqh, sqm, sqd, BLOCK_M, D, D_PAD, TMA, True)
        do = load_rows(DO, b, h, m0, TQ, sdb, sdh, sdm, sdd, BLOCK_M, DV, DV_PAD, TMA, True)
        lse2 = tl.load(LSE + row + offs_m, mask=offs_m < TQ, other=float("inf")) * 1.4426950408889634
        if DELTA_IN_DQ:
            o = load_rows(O, b, h, m0, TQ, sob, soh, som, sod, BLOCK_M, DV, DV_PAD, 0, True)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
            tl.store(DELTA + row + offs_m, delta, mask=offs_m < TQ)
        else:
            delta = tl.load(DELTA + row + offs_m, mask=offs_m < TQ, other=0.0)
        dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        full, hi = key_bounds(m0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
        if ONE_LOOP:
            dq = _dq_inner(dq, q, do, lse2, delta, K, V, b, hk, 0, hi, offs_m, TQ, TK, qk_scale,
                           skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                           BLOCK_N, CAUSAL, 2, TMA, WARP_SPEC, PREC, full, EVEN_K)
        else:
            dq = _dq_inner(dq, q, do, lse2, delta, K, V, b, hk, 0, full, offs_m, TQ, TK, qk_scale,
                           skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                           BLOCK_N, CAUSAL, 0, TMA, WARP_SPEC, PREC)
            dq = _dq_inner(dq, q, do, lse2, delta, K, V, b, hk, full, hi, offs_m, TQ, TK, qk_scale,
                           skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                           BLOCK_N, CAUSAL, 1, TMA, WARP_SPEC, PREC)
        store_rows(DQ, (dq * scale).to(q.dtype), b, h, m0, TQ, s_dqb, s_dqh, s_dqm, s_dqd, BLOCK_M, D, D_PAD, TMA)

    @triton.jit
    def _bwd_kernel(Q, K, V, DO, Q2, K2, V2, DO2, DQ, DK, DV_, LSE, DELTA, DQA, O,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                    s_dqb, s_dqh, s_dqm, s_dqd, s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd,
                    sob, soh, som, sod, B, H, TQ, TK, qk_scale, scale, N_KV_PROGRAMS,
                    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr,
                    BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr, DO_KV: tl.constexpr, DO_Q: tl.constexpr,
                    TMA: tl.constexpr, WARP_SPEC: tl.constexpr, PREC: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                    DELTA_IN_DQ: tl.constexpr, ONE_LOOP: tl.constexpr = False, EVEN_K: tl.constexpr = False,
                    KV_GROUP: tl.constexpr = 1):
        """Programs [0, N_KV_PROGRAMS) compute dk/dv (when DO_KV), the others dq (when DO_Q); a
        launch with both is the fused backward. Q, K, V, DO are the dk/dv programs' inputs, Q2 .. DO2
        the dq programs' (the same tensors; with host descriptors, boxes of their tile shapes).
        Causal dq programs run heaviest first (the last queries see the most keys). DQ_ATOMIC (1:
        element atomics, 2: TMA reductions): the dk/dv programs also add dq into DQA (fp32), and no
        program does the dq pass. DELTA_IN_DQ (a dq-only launch): the dq programs form delta from O.
        KV_GROUP > 1 (grouped-query attention; never fused): axis 1 is the kv head in a dk/dv launch, the
        query head in a dq launch."""
        pid = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
        if DO_KV:
            if pid < N_KV_PROGRAMS:
                _dkdv_program(pid, b, h, Q, K, V, DO, DK, DV_, LSE, DELTA, DQA,
                              sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                              s_dkb, s_dkh, s_dkn, s_dkd, s_dvb, s_dvh, s_dvn, s_dvd, B, H, TQ, TK, qk_scale,
                              scale, D, DV, D_PAD, DV_PAD, BLOCK_M1, BLOCK_N1, CAUSAL, TMA, WARP_SPEC, PREC,
                              DQ_ATOMIC, ONE_LOOP, KV_GROUP)
        if DO_Q:
            if pid >= N_KV_PROGRAMS:
                pid_m = pid - N_KV_PROGRAMS
                if CAUSAL:
                    pid_m = tl.num_programs(0) - 1 - pid
                _dq_program(pid_m, b, h, Q2, K2, V2, DO2, DQ, LSE, DELTA, O,
                            sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
                            s_dqb, s_dqh, s_dqm, s_dqd, sob, soh, som, sod, B, H, TQ, TK, qk_scale, scale,
                            D, DV, D_PAD, DV_PAD, BLOCK_M2, BLOCK_N2, CAUSAL, TMA, WARP_SPEC, PREC, DELTA_IN_DQ,
                            ONE_LOOP, EVEN_K, KV_GROUP)


# Prepared launches (fastlaunch.prepare) of the dq-pass backward with pointer tiles, by what fixes every
# argument but the tensors (shapes, strides, dtypes, device, scale, causality, 16-byte alignment)
_SITES = fastlaunch.SiteCache()


def _keep_site(site_key: tuple, launches: list, named: dict, copy_dq: bool) -> None:
    """Keep the backward's launches for ``site_key`` where ``replay`` can trace and prepare every one;
    ``named``: the call's tensors (do, q, k, v, out, lse, delta, dq_acc, dq, dk, dv)."""
    prepared = replay.steps(launches, named)
    if prepared is not None:
        acc = named["dq_acc"]
        layouts = tuple((tuple(t.shape), t.stride(), t.dtype) for t in (named["dq"], named["dk"], named["dv"]))
        _SITES.put(site_key, _site(prepared, tuple(named["delta"].shape), None if acc is None else tuple(acc.shape),
                                   layouts, copy_dq, named["q"].device))


def _site(prepared: list, delta_size: tuple, acc_size: tuple | None, layouts: tuple, copy_dq: bool, device):
    """The backward from its prepared launches (``replay``: pointers, or the Gluon plans' descriptors rebuilt
    from the new tensors): delta and the fp32 dq sums (where the plan adds dq) allocated as the first call
    did, the caller's gradients or new ones of ``layouts``, the launches in order (delta's, where the plan
    has a delta kernel, then dk/dv and dq, or the fused one; or dq's forming delta, then dk/dv's), then dq
    from its sums (copy_dq)."""

    def bwd(do, q, k, v, out, lse, given):
        ns = {"do": do, "q": q, "k": k, "v": v, "out": out, "lse": lse,
              "delta": torch.empty(delta_size, dtype=torch.float32, device=device),
              "dq_acc": None if acc_size is None else torch.empty(acc_size, dtype=torch.float32, device=device)}
        if given is None:
            ns["dq"], ns["dk"], ns["dv"] = (torch.empty_strided(size, stride, dtype=dtype, device=device)
                                            for size, stride, dtype in layouts)
        else:
            ns["dq"], ns["dk"], ns["dv"] = given
        if not replay.run(prepared, ns):
            return None
        if copy_dq:
            ns["dq"].copy_(ns["dq_acc"])
        return ns["dq"], ns["dk"], ns["dv"]

    return bwd


def _grads_key(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple:
    """What a prepared launch fixes of given gradients: their strides and 16-byte alignment (their shapes and
    dtypes are q's, k's and v's)."""
    return dq.stride(), dk.stride(), dv.stride(), not (dq.data_ptr() | dk.data_ptr() | dv.data_ptr()) & 15


def launch_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, scale: float, causal: bool, plan: plans.BwdPlan | None = None,
               grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each in its input's strides where that is dense, else laid out as (B, T, H, d)
    (tiles.empty_grad); or written into ``grads`` (three tensors of q's, k's and v's shapes and dtypes, any
    strides: views of one packed gradient, say) and returned."""
    site_key = None
    if plan is None and not plans.overridden():
        site_key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), do.stride(), out.stride(),
                    lse.stride(), q.dtype, k.dtype, v.dtype, do.dtype, out.dtype, lse.dtype, q.get_device(),
                    fastlaunch.scalar_key(scale), causal,
                    not (q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr() | out.data_ptr()) & 15,
                    None if grads is None else _grads_key(*grads),
                    torch.are_deterministic_algorithms_enabled())  # (it decides how dq is summed: below)
        site = _SITES.get(site_key)
        if site is not None:
            done = site(do, q, k, v, out, lse, grads)
            if done is not None:
                return done
    B, H, TQ, D = q.shape
    HKV, TK, DV = k.shape[1], k.shape[2], v.shape[3]
    grouped = group_kwargs(H, HKV)
    chosen = plan is not None
    if plan is None:
        plan = plans.plans_for(D, DV, q.dtype, causal, TQ, TK)[1]
    # atomic adds sum dq in a varying order: under torch.use_deterministic_algorithms, the dq pass
    deterministic = torch.are_deterministic_algorithms_enabled()
    if plan.gluon:
        why = (gluon_common.supported(q, k, v) or (None if tma_eligible(do) else "do is not TMA-readable")
               or bwd_gluon.budget_reason(D, plan, plan.dq_mode == "tma_add" and not deterministic))
        if why is not None and chosen:
            raise ValueError(f"{plan} cannot run here: {why}")
        if why is not None:  # a table plan for inputs the Gluon kernels take: elsewhere, the Triton kernels'
            plan = plans.triton_plans(D, DV, q.dtype, causal, TQ, TK)[1]  # measured plan
    if HKV != H and plan.fused:  # (one grid: its axis 1 cannot be both the kv heads and the query heads)
        if chosen:
            raise ValueError(f"{plan} cannot run here: the fused backward takes k and v with q's number of heads "
                             f"(got {H} and {HKV}: grouped-query attention runs the two passes, fused=False)")
        plan = dataclasses.replace(plan, fused=False)
    d_pad, dv_pad = plans.head_pad(D), plans.head_pad(DV)
    atomic = 0 if plan.dq_mode == "pass" or plan.gluon or deterministic else 1
    add_dq = plan.gluon == 1 and plan.dq_mode == "tma_add" and not deterministic  # (the Gluon dk/dv kernel adds dq)
    # the fp32 dq sums (zeroed by the delta kernel): rows of d_pad for the Triton kernels, of D for the Gluon one
    acc_d = D if add_dq else d_pad if atomic else 0
    dq_acc = torch.empty((B, H, TQ, acc_d), dtype=torch.float32, device=q.device) if acc_d else None
    delta = torch.empty((B, H, TQ), dtype=torch.float32, device=q.device)
    # delta in the dq pass (the plan's switch; dq_mode "pass", unfused; the Triton dq pass, or the Gluon one
    # with gluon=2): that pass first, then dk/dv, and no delta kernel
    delta_in_dq = plan.delta_in_dq and not atomic and not add_dq
    launches = []
    if not delta_in_dq:
        launches.append((_delta_kernel, (fastlaunch.cdiv(TQ, plan.pre_block), H, B),
                         (out, do, delta, delta if dq_acc is None else dq_acc, *out.stride(), *do.stride(), H, TQ),
                         dict(DV=DV, DV_PAD=dv_pad, BLOCK=plan.pre_block, ACC_D=acc_d)))
        fastlaunch.launch(*launches[0])
    # the gradients in their inputs' strides, or the layout of the model's q/k/v views (tiles.empty_grad)
    if grads is None:
        dq, dk, dv = empty_grad(q), empty_grad(k), empty_grad(v)
    else:
        dq, dk, dv = grads
    tma = resolve_tma(plan.tma, q.device, q, k, v, do, dq, dk, dv)
    bm1, bn1, bm2, bn2 = plan.block_m1, plan.block_n1, plan.block_m2, plan.block_n2
    n_kv, n_q = fastlaunch.cdiv(TK, bn1), fastlaunch.cdiv(TQ, bm2)
    common = dict(D=D, DV=DV, D_PAD=d_pad, DV_PAD=dv_pad, BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2,
                  BLOCK_N2=bn2, CAUSAL=causal, TMA=TMA_CODE[tma], WARP_SPEC=plan.warp_specialize,
                  PREC=precision(q.dtype), ONE_LOOP=plan.one_loop, EVEN_K=TK % bn2 == 0, **grouped)
    if tma == "device":
        ensure_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *dk.stride(), *dv.stride(),
               *out.stride())
    # what the dk/dv programs add dq into: the buffer, or (tma_add, where TMA is) its descriptor; else a dummy
    dq_sums = dq_acc if atomic else delta
    if atomic and plan.dq_mode == "tma_add" and not interpreter_enabled():
        if resolve_tma("host", q.device, dq_acc) == "host":
            atomic, dq_sums = 2, host_descriptor(dq_acc, bm1, d_pad)
    if tma == "host":  # one box shape per descriptor: the dk/dv programs' tiles, then the dq programs'
        kv_ins = (host_descriptor(q, bm1, d_pad), host_descriptor(k, bn1, d_pad), host_descriptor(v, bn1, dv_pad),
                  host_descriptor(do, bm1, dv_pad))
        kv_outs = (host_descriptor(dk, bn1, d_pad), host_descriptor(dv, bn1, dv_pad))
        if atomic:  # no dq programs: their slots take the dk/dv programs' descriptors (same types), unread
            ins, outs = kv_ins * 2, (kv_outs[0], *kv_outs)
        else:
            ins = (*kv_ins, host_descriptor(q, bm2, d_pad), host_descriptor(k, bn2, d_pad),
                   host_descriptor(v, bn2, dv_pad), host_descriptor(do, bm2, dv_pad))
            outs = (host_descriptor(dq, bm2, d_pad), *kv_outs)
    else:
        ins, outs = (q, k, v, do, q, k, v, do), (dq, dk, dv)
    sizes = (B, H, TQ, TK, scale * LOG2E, scale)

    def launch(n_programs: int, n_kv: int, do_kv: bool, do_q: bool, warps: int, stages: int) -> None:
        one = (_bwd_kernel, (n_programs, HKV if do_kv and not do_q else H, B), (*ins, *outs, lse, delta, dq_sums, out, *strides, *sizes, n_kv),
               dict(common, DO_KV=do_kv, DO_Q=do_q, DQ_ATOMIC=atomic, DELTA_IN_DQ=delta_in_dq and not do_kv,
                    num_warps=warps, num_stages=stages))
        fastlaunch.launch(*one)
        launches.append(one)

    if plan.gluon:  # dk/dv by the Gluon kernel; dq by it too (tma_add), the Triton pass (1) or the Gluon one (2)
        if delta_in_dq and plan.gluon == 1:  # (the dq pass first: it forms delta)
            launch(n_q, 0, False, True, plan.dq_warps, plan.dq_stages)
        elif delta_in_dq:
            bwd_gluon_dq.launch_dq(do, q, k, v, lse, delta, dq, scale, causal, plan.block_m2, plan.block_n2,
                                   plan.dq_stages, out, lpt_mb=plan.lpt_mb, launched=launches)
        bwd_gluon.launch_dkdv(do, q, k, v, lse, delta, dk, dv, scale, causal, plan.block_n1, plan.block_m1,
                              plan.num_stages, dq_acc, overlap=plan.overlap, dq_split=plan.dq_split and add_dq,
                              lpt_mb=plan.lpt_mb, launched=launches)
        if add_dq:
            dq.copy_(dq_acc)
        elif plan.gluon == 2 and not delta_in_dq:
            bwd_gluon_dq.launch_dq(do, q, k, v, lse, delta, dq, scale, causal, plan.block_m2, plan.block_n2,
                                   plan.dq_stages, lpt_mb=plan.lpt_mb, launched=launches)
        elif not delta_in_dq:
            launch(n_q, 0, False, True, plan.dq_warps, plan.dq_stages)
        if site_key is not None and tma != "device":  # (device descriptors: their allocator, per call)
            _keep_site(site_key, launches, dict(do=do, q=q, k=k, v=v, out=out, lse=lse, delta=delta, dq_acc=dq_acc,
                                                dq=dq, dk=dk, dv=dv), add_dq)
        return dq, dk, dv
    if atomic:
        launch(n_kv, n_kv, True, False, plan.num_warps, plan.num_stages)
        dq.copy_(dq_acc[..., :D])
    elif plan.fused:
        launch(n_kv + n_q, n_kv, True, True, plan.num_warps, plan.num_stages)
    elif delta_in_dq:
        launch(n_q, 0, False, True, plan.dq_warps, plan.dq_stages)
        launch(n_kv, n_kv, True, False, plan.num_warps, plan.num_stages)
    else:
        launch(n_kv, n_kv, True, False, plan.num_warps, plan.num_stages)
        launch(n_q, 0, False, True, plan.dq_warps, plan.dq_stages)
    if site_key is not None and plan.dq_mode == "pass" and tma == "off":  # (pointer tiles, no dq sums)
        _keep_site(site_key, launches, dict(do=do, q=q, k=k, v=v, out=out, lse=lse, delta=delta, dq_acc=dq_acc,
                                            dq=dq, dk=dk, dv=dv), False)
    return dq, dk, dv
