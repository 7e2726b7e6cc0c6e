"""The flash forward kernel and its launcher (the algorithm is in the package docstring).

One program per (BLOCK_M queries, head, batch): q stays on chip, the loop streams BLOCK_N keys and
values, keeping the running max m, the running sum l and the fp32 output accumulator (online
softmax). Causal programs are launched heaviest first (the last query blocks see the most keys), so
the short ones fill the tail of the grid.
"""

from __future__ import annotations

import torch

from kernels.methods.flash import fwd_gluon, gluon_common, replay
from kernels.methods.flash import plan as plans
from kernels.methods.flash.tiles import (LOG2E, TMA_CODE, device_descriptor, empty_bthd, ensure_allocator,
                                         fast_log2, host_descriptor, interpreter_enabled, key_bounds, kv_group,
                                         load_rows, mma, store_rows, tl, tma_eligible, tma_supported, triton)
from kernels.runtime import fastlaunch

if triton is not None:

    @triton.jit
    def _fwd_inner(acc, l_i, m_i, q, K, V, b, h, lo, hi, offs_m, TQ, TK, qk_scale,
                   skb, skh, skn, skd, svb, svh, svn, svd,
                   D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                   SCALE_POS: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr, PREC: tl.constexpr,
                   SUM_MMA: tl.constexpr, mask_from=0, EVEN_K: tl.constexpr = False):
        """Keys lo .. hi into (acc, l, m). MASKED 1: the causal diagonal and the end of the keys (scores
        -inf there; a row with no key yet keeps m = -inf and adds exactly 0); 0: no mask at all; 2
        (``FwdPlan.one_loop``): the mask on the tiles from ``mask_from`` on, under a branch the whole program
        takes alike, so one pipelined loop covers the full and the masked tiles, their loads issued while the
        full tiles compute (two loops: the second starts its own pipeline after the first drains); EVEN_K:
        Tk is a multiple of BLOCK_N, so no load needs a row mask.
        SUM_MMA: l is a (BLOCK_M, 16) tile, every column the row's sum, added by the tensor cores (p times
        a tile of ones, beside p v) instead of by a reduction of p (-7.5% at (16, 12, 1024, 64) on an H100,
        docs/perf.md: Triton 3.6 waits for each of the two products on its own; the Gluon consumers wait once)."""
        for n0 in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
            n0 = tl.multiple_of(n0, BLOCK_N)
            rows_masked: tl.constexpr = MASKED == 1 or (MASKED == 2 and not EVEN_K)
            k = load_rows(K, b, h, n0, TK, skb, skh, skn, skd, BLOCK_N, D, D_PAD, TMA, rows_masked)
            s = mma(q, tl.trans(k), None, PREC)  # (BLOCK_M, BLOCK_N) fp32 scores
            if MASKED == 1:
                offs_n = n0 + tl.arange(0, BLOCK_N)
                keep = offs_n[None, :] < TK
                if CAUSAL:
                    keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
                s = tl.where(keep, s * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp2(-inf) = 0
                p = tl.math.exp2(s - m_ref[:, None])
                alpha = tl.math.exp2(m_i - m_ref)
            elif MASKED == 2:
                if n0 >= mask_from:  # (the branch holds the mask alone: holding the softmax, it broke the pipeliner)
                    offs_n = n0 + tl.arange(0, BLOCK_N)
                    keep = offs_n[None, :] < TK
                    if CAUSAL:
                        keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
                    s = tl.where(keep, s, float("-inf"))
                if SCALE_POS:  # (-inf stays -inf)
                    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                else:
                    s = tl.where(s == float("-inf"), s, s * qk_scale)
                    m_new = tl.maximum(m_i, tl.max(s, 1))
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.math.exp2(m_i - m_ref)
                if SCALE_POS:
                    p = tl.math.exp2(s * qk_scale - m_ref[:, None])
                else:
                    p = tl.math.exp2(s - m_ref[:, None])
            elif SCALE_POS:  # max(s * c) = max(s) * c (c > 0): one FMA per score
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                p = tl.math.exp2(s * qk_scale - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            else:
                s = s * qk_scale
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.math.exp2(s - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            v = load_rows(V, b, h, n0, TK, svb, svh, svn, svd, BLOCK_N, DV, DV_PAD, TMA, rows_masked)
            if SUM_MMA:
                p16 = p.to(v.dtype)
                acc = mma(p16, v, acc, PREC)
                l_i = mma(p16, tl.full([BLOCK_N, 16], 1.0, v.dtype), l_i * alpha[:, None], PREC)
            else:
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = mma(p.to(v.dtype), v, acc, PREC)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _fwd_kernel(Q, K, V, O, LSE,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                    B, H, TQ, TK, qk_scale,
                    D: tl.constexpr, DV: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                    SCALE_POS: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr, PREC: tl.constexpr,
                    GROUP: tl.constexpr, SUM_MMA: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
                    EVEN_K: tl.constexpr = False, KV_GROUP: tl.constexpr = 1):
        """KV_GROUP: query heads per kv head (grouped-query attention): head h reads kv head h // KV_GROUP
        through k's and v's own strides (1: h itself, the same code as without groups)."""
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
        if CAUSAL:
            n_m = tl.num_programs(0)
            if GROUP == 1:  # head by head, each head's heaviest query block first
                pid_m = n_m - 1 - pid_m
            else:  # the start order (x fastest) remapped: GROUP heads at a time, heaviest blocks first
                lin = pid_m + n_m * (h + H * b)
                first = (lin // (GROUP * n_m)) * GROUP  # the group's first head (of B * H)
                size = tl.minimum(GROUP, B * H - first)  # the last group may be smaller
                j = lin - first * n_m
                pid_m = n_m - 1 - j // size
                hb = first + j % size
                h = hb % H
                b = hb // H
        m0 = pid_m * BLOCK_M
        hk = h // KV_GROUP
        if TMA == 2:
            Q = device_descriptor(Q, B, H, TQ, sqb, sqh, sqm, BLOCK_M, D, D_PAD)
            K = device_descriptor(K, B, H // KV_GROUP, TK, skb, skh, skn, BLOCK_N, D, D_PAD)
            V = device_descriptor(V, B, H // KV_GROUP, TK, svb, svh, svn, BLOCK_N, DV, DV_PAD)
            O = device_descriptor(O, B, H, TQ, sob, soh, som, BLOCK_M, DV, DV_PAD)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q = load_rows(Q, b, h, m0, TQ, sqb, sqh, sqm, sqd, BLOCK_M, D, D_PAD, TMA, True)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        if SUM_MMA:
            l_i = tl.zeros([BLOCK_M, 16], tl.float32)
        else:
            l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
        full, hi = key_bounds(m0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
        if ONE_LOOP:
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, b, hk, 0, hi, offs_m, TQ, TK, qk_scale,
                                       skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                                       BLOCK_N, CAUSAL, 2, SCALE_POS, TMA, WARP_SPEC, PREC, SUM_MMA, full, EVEN_K)
        else:
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, b, hk, 0, full, offs_m, TQ, TK, qk_scale,
                                       skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                                       BLOCK_N, CAUSAL, 0, SCALE_POS, TMA, WARP_SPEC, PREC, SUM_MMA)
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, b, hk, full, hi, offs_m, TQ, TK, qk_scale,
                                       skb, skh, skn, skd, svb, svh, svn, svd, D, DV, D_PAD, DV_PAD,
                                       BLOCK_N, CAUSAL, 1, SCALE_POS, TMA, WARP_SPEC, PREC, SUM_MMA)
        if SUM_MMA:
            l_i = tl.max(l_i, 1)  # (its 16 equal columns)
        # rows with no key (causal, Tq > Tk): l = 0, output 0, lse = +inf (the backward's
        # exp(s - lse) is then exactly 0: zero gradient, no NaN)
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)  # (l >= 1 otherwise: the max's own exponential is 1)
        inv = tl.math.fdiv(1.0, l_safe)  # (div.full: 2 ulp, without the precise division's denormal path)
        lse = tl.where(empty, float("inf"), (m_i + fast_log2(l_safe)) * 0.6931471805599453)
        tl.store(LSE + (b * H + h).to(tl.int64) * TQ + offs_m, lse, mask=offs_m < TQ)
        store_rows(O, (acc * inv[:, None]).to(q.dtype), b, h, m0, TQ, sob, soh, som, sod, BLOCK_M, DV, DV_PAD, TMA)


#: PREC of 16-bit inputs: tensor cores, or widened dots where the kernels were built for Triton's
#: interpreter (decided when triton.jit wrapped them, at import: so read once, not per call)
_PREC_16 = 2 if interpreter_enabled() else 0


def precision(dtype: torch.dtype) -> int:
    """The kernels' PREC (see tiles.mma): fp32 full-precision dots, 16-bit tensor cores (widened
    under the interpreter)."""
    return 1 if dtype == torch.float32 else _PREC_16


def group_kwargs(n_head: int, n_kv_head: int) -> dict:
    """The kernels' KV_GROUP (query heads per kv head; 1, the constexpr's default, without groups: the same
    specialization as before). Always by keyword: fastlaunch's direct path needs every constexpr given so."""
    return {"KV_GROUP": kv_group(n_head, n_kv_head)}


def resolve_tma(mode: str, device: torch.device, *tensors: torch.Tensor) -> str:
    """The plan's TMA mode where this device and these tensors allow it, else "off" (pointers)."""
    if mode == "off" or not tma_supported(device) or not tma_eligible(*tensors):
        return "off"
    return mode


# Prepared launches (fastlaunch.prepare, through replay) by what fixes every argument but the tensors: a
# later call with the same shapes, strides, dtypes, device, scale and causality (and 16-byte alignment of
# q, k, v) skips the plan lookup, the checks, the argument tuple and the specialization key
_SITES = fastlaunch.SiteCache()


def _keep_site(site_key: tuple, launched: list, q, k, v, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Keep the forward's launch for ``site_key`` where ``replay`` can trace and prepare it."""
    prepared = replay.steps(launched, dict(q=q, k=k, v=v, out=out, lse=lse))
    if prepared is not None:
        _SITES.put(site_key, _site(prepared, tuple(out.shape), out.stride(), tuple(lse.shape), q.dtype, q.device))


def _site(prepared: list, out_size: tuple, out_stride: tuple, lse_size: tuple, dtype, device):
    """The forward from its prepared launch (``replay``: pointers, or the Gluon plans' descriptors rebuilt
    from the new tensors)."""

    def fwd(q, k, v):
        ns = {"q": q, "k": k, "v": v, "out": torch.empty_strided(out_size, out_stride, dtype=dtype, device=device),
              "lse": torch.empty(lse_size, dtype=torch.float32, device=device)}
        return (ns["out"], ns["lse"]) if replay.run(prepared, ns) else None

    return fwd


def launch_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
               plan: plans.FwdPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, Tq, dv) in q's dtype, laid out as (B, Tq, H, dv) in memory (the model's next
    transpose-and-view is then free), and lse (B, H, Tq) fp32, the natural log-sum-exp of each row's
    scaled scores (+inf for a row with no key)."""
    site_key = None
    if plan is None and not plans.overridden():
        site_key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                    q.get_device(), fastlaunch.scalar_key(scale), causal,
                    not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15)
        site = _SITES.get(site_key)
        if site is not None:
            done = site(q, k, v)
            if done is not None:
                return done
    B, H, TQ, D = q.shape
    TK, DV = k.shape[2], v.shape[3]
    chosen = plan is not None
    if plan is None:
        plan = plans.plans_for(D, DV, q.dtype, causal, TQ, TK)[0]
    if plan.gluon:
        why = gluon_common.supported(q, k, v) or fwd_gluon.budget_reason(D, plan.block_n, plan.num_stages,
                                                                     plan.persistent, plan.block_m, plan.sum_mma)
        if why is None:
            launched = [] if site_key is not None else None
            out, lse = fwd_gluon.launch_fwd(q, k, v, scale, causal, plan.block_m, plan.block_n, plan.num_stages,
                                            pingpong=plan.gluon == 2, persistent=plan.persistent,
                                            overlap=plan.overlap, section_mb=plan.section_mb, sum_mma=plan.sum_mma,
                                            launched=launched)
            if launched:
                _keep_site(site_key, launched, q, k, v, out, lse)
            return out, lse
        if chosen:
            raise ValueError(f"{plan} cannot run here: {why}")
        # a table plan for inputs the Gluon kernel takes: elsewhere, the Triton kernel's measured plan
        plan = plans.triton_plans(D, DV, q.dtype, causal, TQ, TK)[0]
    out = empty_bthd(B, H, TQ, DV, q.dtype, q.device)
    lse = torch.empty((B, H, TQ), dtype=torch.float32, device=q.device)
    d_pad, dv_pad = plans.head_pad(D), plans.head_pad(DV)
    bm, bn = plan.block_m, plan.block_n
    tma = resolve_tma(plan.tma, q.device, q, k, v, out)
    if tma == "host":
        qa, ka = host_descriptor(q, bm, d_pad), host_descriptor(k, bn, d_pad)
        va, oa = host_descriptor(v, bn, dv_pad), host_descriptor(out, bm, dv_pad)
    else:
        qa, ka, va, oa = q, k, v, out
        if tma == "device":
            ensure_allocator()
    one = (_fwd_kernel, (fastlaunch.cdiv(TQ, bm), H, B),
           (qa, ka, va, oa, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), B, H, TQ, TK, scale * LOG2E),
           dict(D=D, DV=DV, D_PAD=d_pad, DV_PAD=dv_pad, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
                SCALE_POS=scale > 0, TMA=TMA_CODE[tma], WARP_SPEC=plan.warp_specialize,
                PREC=precision(q.dtype), GROUP=plan.group if causal else 1, SUM_MMA=plan.sum_mma,
                ONE_LOOP=plan.one_loop, EVEN_K=TK % bn == 0, **group_kwargs(H, k.shape[1]),
                num_warps=plan.num_warps,
                num_stages=plan.num_stages, **({"maxnreg": plan.maxnreg} if plan.maxnreg else {})))
    fastlaunch.launch(*one)
    if site_key is not None and tma == "off":  # (descriptors hold their tensors, and device ones want an allocator)
        _keep_site(site_key, [one], q, k, v, out, lse)
    return out, lse
