"""Launches of the ``triton`` softmax: :func:`launch_fwd` and :func:`launch_bwd` view the input as rows x N,
take the plan for its row length (``plan.plan``) and launch that path's kernel (``tile``, ``gluon``),
falling back to the next-best plan where a Gluon path cannot take the rows. Every launch goes through
``fastlaunch.launch`` (the compiled kernel's launcher called directly once it is known, on a GPU); the
device is asked once per call (for the guard and the launch). A contiguous input's single-kernel launch
is then kept prepared (``fastlaunch.prepare``) by what fixes every other argument, so the next call
with that shape, dtype, device, scale and causality allocates its output and launches, nothing else."""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

import kernels.methods.triton.softmax.gluon as gluon
import kernels.methods.triton.softmax.tile as tile
from kernels.methods.triton.softmax.plan import (
    HYBRID_MAX_REGS,
    LOG2E,
    Plan,
    _hybrid_shape,
    _next_pow2,
    _persistent_grid,
    _ring_shape,
    cached_plan,
    fill_scale_ok,
    gluon_unusable,
    ring_pairs,
    ring_slots,
)
from kernels.runtime import fastlaunch
from kernels.runtime.availability import interpreter_enabled


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """x as a (rows, N) view when the leading dims flatten to one row stride; else one copy."""
    n = x.shape[-1]
    try:
        return x.view(-1, n)
    except RuntimeError:
        return x.reshape(-1, n)  # leading dims not flattenable (e.g. transposed): one copy


def _causal_geometry(shape: torch.Size, causal: bool) -> tuple[int, int]:
    if not causal:
        return 1, 0
    tq, tk = shape[-2], shape[-1]
    return tq, tk - tq


_NO_GUARD = contextlib.nullcontext()
_run = fastlaunch.launch


def _device_guard(dev: int):
    """Launch on GPU dev (x.get_device(); -1: a CPU tensor, the interpreter): a guard only when it is not
    the current one (the guard costs microseconds)."""
    if dev >= 0 and dev != torch.cuda.current_device():
        return torch.cuda.device(dev)
    return _NO_GUARD


def _launch_split(kernel, p: Plan, n_rows: int, n_cols: int, device, tensors: tuple, args: tuple,
                  causal: bool, dev: int) -> None:
    """One program per chunk; a zeroed ticket + per-row arrival counter and a partials workspace
    (2 floats per chunk forward, 1 backward; allocated per call: the counters must start at zero)."""
    splits = -(-n_cols // p.block_n)
    programs = n_rows * splits
    if programs >= 2**31:
        raise ValueError(f"too many row chunks for one launch ({n_rows} rows x {splits} chunks)")
    stat = torch.empty(n_rows * splits * 2, dtype=torch.float32, device=device)
    meta = dict(BLOCK_N=p.block_n, SPLITS_P2=_next_pow2(splits), CAUSAL=causal, num_warps=p.num_warps)
    if interpreter_enabled():  # programs run one after another: partials first, then outputs
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        for phase in (1, 2):
            kernel[(programs,)](*tensors, cnt, stat, n_cols, splits, *args, PHASE=phase, **meta)
    else:
        cnt = torch.zeros(n_rows + 1, dtype=torch.int32, device=device)
        meta["PHASE"] = 0
        _run(kernel, (programs,), (*tensors, cnt, stat, n_cols, splits, *args), meta, dev)


def _hybrid_launch(x2: torch.Tensor, y: torch.Tensor, scale: float, p: Plan) -> tuple:
    n_rows, n_cols = x2.shape
    nr, ns, even = _hybrid_shape(n_cols, p)
    return (gluon._fwd_hybrid_kernel, (n_rows,),
            (x2, y, x2.view(torch.int32), y.view(torch.int32), n_cols // 8, x2.stride(0) // 8, scale * LOG2E, 0),
            dict(NR=nr, NS=ns, EVEN=even, BF16=x2.dtype == torch.bfloat16, num_warps=p.num_warps,
                 maxnreg=HYBRID_MAX_REGS))


def _ring_launch(y2: torch.Tensor, dy2: torch.Tensor, dx: torch.Tensor, xch: torch.Tensor, scale: float,
                 p: Plan) -> tuple:
    """The ring backward's launch; xch: the pairs' partials, 2 x rows int64, zeroed (per call)."""
    n_rows, n_cols = y2.shape
    vec, _, nch = _ring_shape(y2, p)
    pairs = ring_pairs(n_rows, y2.device, p)
    return (gluon._bwd_pair_ring_kernel, (2 * pairs,),
            (y2, dy2, dx, xch, n_rows, n_cols // vec, dy2.stride(0) // vec, scale),
            dict(VEC=vec, NCH=nch, SLOTS=ring_slots(y2.device, p), num_warps=p.num_warps))


# Prepared launches (fastlaunch.prepare) of contiguous inputs, by what fixes every argument but the
# addresses: a later call with the same shape, dtype, device, scale and causality (and alignment of the
# input, which picks the Gluon paths) skips the plan, the views and the specialization key
_FWD_SITES = fastlaunch.SiteCache()
_BWD_SITES = fastlaunch.SiteCache()
_CONTIGUOUS = torch.contiguous_format


def _fwd_site(prep, hybrid: bool):
    if hybrid:  # (the kernel also takes both rows as int32 views)
        return lambda x, y: prep(x, y, x.view(torch.int32), y.view(torch.int32))
    return prep


def _bwd_site(prep, ring_rows: Optional[int], device):
    if ring_rows is None:
        return prep

    def ring(y, dy, dx):  # (the pairs' partials, zeroed per call)
        return prep(y, dy, dx, torch.zeros(2 * ring_rows, dtype=torch.int64, device=device))

    return ring


def launch_fwd(x: torch.Tensor, scale: float, causal: bool, p: Optional[Plan] = None) -> torch.Tensor:
    site_key = None
    if p is None and x.is_contiguous():
        site_key = (x.shape, x.stride(), x.dtype, x.get_device(), fastlaunch.scalar_key(scale), causal,
                    not x.data_ptr() & 15)
        site = _FWD_SITES.get(site_key)
        if site is not None:
            y = torch.empty_like(x, memory_format=_CONTIGUOUS)  # (canonical strides, as the general path's)
            if site(x, y):
                return y
    x2 = _rows_view(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.view(x.shape)
    p = p or cached_plan(n_cols, x.element_size(), causal=causal)
    if p.ring:
        raise ValueError("the ring path is a backward path (the forward's Gluon path is the hybrid one)")
    if p.hybrid and gluon_unusable(x2, causal, p):  # (unaligned rows, the interpreter): the next-best plan
        p = cached_plan(n_cols, x.element_size(), causal=causal, gluon=False)
    tq, diag = _causal_geometry(x.shape, causal)
    c = scale * LOG2E
    dev = x.get_device()
    guard = _device_guard(dev)
    with guard:
        if p.split:
            _launch_split(tile._fwd_split_kernel, p, n_rows, n_cols, x.device,
                          (x2, y), (x2.stride(0), x2.stride(1), tq, diag, c), causal, dev)
            return y.view(x.shape)
        if p.hybrid:
            one = _hybrid_launch(x2, y, scale, p)
        elif p.stages:
            one = (tile._fwd_persist_kernel, (_persistent_grid(n_rows, x.device, p),),
                   (x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, c),
                   dict(BLOCK_N=p.block_n, CAUSAL=causal, STAGES=p.stages, num_warps=p.num_warps))
        elif p.long:
            one = (tile._fwd_long_kernel, (n_rows,), (x2, y, n_cols, x2.stride(0), x2.stride(1), tq, diag, c),
                   dict(BLOCK_N=p.block_n, CAUSAL=causal, num_warps=p.num_warps))
        elif p.fill and fill_scale_ok(c):
            one = (tile._fwd_fill_kernel, (-(-n_rows // p.rows),),
                   (x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, c, -math.inf if c > 0 else math.inf),
                   dict(BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, num_warps=p.num_warps))
        else:  # (a fill plan whose scale the fill cannot take: the same tile, masked element by element)
            one = (tile._fwd_tile_kernel, (-(-n_rows // p.rows),),
                   (x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, c),
                   dict(BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, ROUND_MASK=p.round_mask, num_warps=p.num_warps))
        _run(*one, dev)
    if site_key is not None and guard is _NO_GUARD:
        prep = fastlaunch.prepare(*one, dev)
        if prep is not None:
            _FWD_SITES.put(site_key, _fwd_site(prep, p.hybrid))
    return y.view(x.shape)


def launch_bwd(
    y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool, p: Optional[Plan] = None
) -> torch.Tensor:
    site_key = None
    if p is None and y.is_contiguous() and dy.is_contiguous():
        site_key = (y.shape, y.stride(), dy.stride(), y.dtype, dy.dtype, y.get_device(), fastlaunch.scalar_key(scale),
                    causal, not (y.data_ptr() | dy.data_ptr()) & 15)
        site = _BWD_SITES.get(site_key)
        if site is not None:
            dx = torch.empty_like(y, memory_format=_CONTIGUOUS)
            if site(y, dy, dx):
                return dx
    y2 = y.view(-1, y.shape[-1])  # y is our own contiguous output
    dy2 = _rows_view(dy)
    n_rows, n_cols = y2.shape
    dx = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device)
    if n_rows == 0:
        return dx.view(y.shape)
    p = p or cached_plan(n_cols, y.element_size(), backward=True, causal=causal)
    if p.hybrid or p.fill:
        raise ValueError(f"the {'hybrid' if p.hybrid else 'fill'} path is a forward path")
    if p.ring and gluon_unusable(y2, causal, p, dy2):  # (unaligned rows, the interpreter): the next-best plan
        p = cached_plan(n_cols, y.element_size(), backward=True, causal=causal, gluon=False)
    tq, diag = _causal_geometry(y.shape, causal)
    dev = y.get_device()
    guard = _device_guard(dev)
    with guard:
        if p.split:
            _launch_split(tile._bwd_split_kernel, p, n_rows, n_cols, y.device,
                          (y2, dy2, dx), (dy2.stride(0), dy2.stride(1), tq, diag, scale), causal, dev)
            return dx.view(y.shape)
        if p.ring:
            one = _ring_launch(y2, dy2, dx, torch.zeros(2 * n_rows, dtype=torch.int64, device=y.device), scale, p)
        elif p.stages:
            one = (tile._bwd_persist_kernel, (_persistent_grid(n_rows, y.device, p),),
                   (y2, dy2, dx, n_rows, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale),
                   dict(BLOCK_N=p.block_n, CAUSAL=causal, STAGES=p.stages, NARROW=p.narrow, num_warps=p.num_warps))
        elif p.long:
            one = (tile._bwd_long_kernel, (n_rows,),
                   (y2, dy2, dx, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale),
                   dict(BLOCK_N=p.block_n, CAUSAL=causal, num_warps=p.num_warps))
        else:
            one = (tile._bwd_tile_kernel, (-(-n_rows // p.rows),),
                   (y2, dy2, dx, n_rows, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale),
                   dict(BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, ROUND_MASK=p.round_mask, RELOAD=p.reload,
                        NARROW=p.narrow,
                        WHOLE=not causal and n_cols == p.block_n and n_rows % p.rows == 0 and not p.reload,
                        num_warps=p.num_warps))
        _run(*one, dev)
    if site_key is not None and guard is _NO_GUARD:
        prep = fastlaunch.prepare(*one, dev)
        if prep is not None:
            _BWD_SITES.put(site_key, _bwd_site(prep, n_rows if p.ring else None, y.device))
    return dx.view(y.shape)
