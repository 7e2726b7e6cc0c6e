"""The `triton` cross-entropy's reduction kernels, around the row kernels of
:mod:`.kernels`: the target count and range check (``count_targets``: n_valid for
'mean', on the device, no host sync), the loss from its rows (``reduce_loss``) and the backward's
multiply by grad_output (``scale_grad_``: in place, no work where the factor is exactly 1). Small
launches (one program, or a few per SM), through the direct launch path (``fastlaunch``)."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

import triton
import triton.language as tl

from kernels.methods.triton.softmax.plan import _next_pow2
from kernels.runtime import fastlaunch
from kernels.runtime.device import device_props

@triton.jit(debug=True)  # debug: the device assert is compiled in (only this small kernel pays for it)
def _targets_kernel(T, COUNT, n_rows, n_cols, ignore_index, BLOCK: tl.constexpr):
    """COUNT[0] = the number of targets that are not ignore_index (fp32); a device assert on targets
    outside [0, V) that are not ignore_index. One program (N x 8 bytes)."""
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        t = tl.load(T + offs, mask=offs < n_rows, other=ignore_index)
        valid = t != ignore_index
        tl.device_assert(((t >= 0) & (t < n_cols)) | (~valid),
                         "cross_entropy: a target is outside [0, V) and is not ignore_index")
        acc += valid.to(tl.int32)
    tl.store(COUNT, tl.sum(acc, axis=0).to(tl.float32))


@triton.jit
def _reduce_kernel(LOSS, COUNT, OUT, n_rows, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[0] = sum of the loss rows (/ max(n_valid, 1) for 'mean'), one program, a fixed order."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(LOSS + offs, mask=offs < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.maximum(tl.load(COUNT), 1.0)
    tl.store(OUT, total)


@triton.jit
def _scale_kernel(G, GO, COUNT, n_rows, n_cols, stride_gr, stride_go, PER_ROW: tl.constexpr,
                  DIVIDE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """G *= grad_output (per row with PER_ROW; / max(n_valid, 1) with DIVIDE), in place, persistent
    programs over tiles of ROWS x BLOCK_N. Nothing is read or written where the factor is exactly 1."""
    col_tiles = tl.cdiv(n_cols, BLOCK_N)
    n_tiles = tl.cdiv(n_rows, ROWS) * col_tiles
    div = 1.0
    if DIVIDE:
        div = tl.maximum(tl.load(COUNT), 1.0)
    if PER_ROW:
        for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            rows = (tile // col_tiles) * ROWS + tl.arange(0, ROWS)
            cols = (tile % col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            f = tl.load(GO + rows.to(tl.int64) * stride_go, mask=rows < n_rows, other=1.0).to(tl.float32) / div
            if tl.sum((f != 1.0).to(tl.int32), axis=0) > 0:  # (NaN != 1: scaled)
                ptr = G + rows.to(tl.int64)[:, None] * stride_gr + cols[None, :]
                ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
                g = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
                tl.store(ptr, (g * f[:, None]).to(G.dtype.element_ty), mask=ok)
    else:
        f = tl.load(GO).to(tl.float32) / div
        if f != 1.0:
            for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
                rows = (tile // col_tiles) * ROWS + tl.arange(0, ROWS)
                cols = (tile % col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
                ptr = G + rows.to(tl.int64)[:, None] * stride_gr + cols[None, :]
                ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
                g = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
                tl.store(ptr, (g * f).to(G.dtype.element_ty), mask=ok)


def _device_guard(x: Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _persistent_programs(n_tiles: int, device: torch.device) -> int:
    if device.type != "cuda":
        return max(1, min(n_tiles, 4))  # the interpreter: a few programs, each looping over tiles
    return max(1, min(n_tiles, 4 * device_props(device).multi_processor_count))


#: the small kernels around the row kernel (count, reduction, backward scale) go through the direct
#: launch path (``fastlaunch``: Triton's launcher without ``JITFunction.run``'s per-call Python)
_launch = fastlaunch.launch


def count_targets(targets: Tensor, n_cols: int, ignore_index: int) -> Tensor:
    """(1,) fp32: the targets that are not ignore_index, on the device (and the device-side range check)."""
    count = torch.empty(1, dtype=torch.float32, device=targets.device)
    with _device_guard(targets):
        _launch(_targets_kernel, (1,), (targets, count, targets.shape[0], n_cols, ignore_index),
                dict(BLOCK=1024, num_warps=4))
    return count


def reduce_loss(loss_rows: Tensor, count: Tensor, reduction: str) -> Tensor:
    """The loss from its rows: their mean over the valid targets, their sum, or a copy ('none')."""
    if reduction == "none":
        return loss_rows.clone()
    out = torch.empty((), dtype=torch.float32, device=loss_rows.device)
    with _device_guard(loss_rows):
        _launch(_reduce_kernel, (1,), (loss_rows, count, out, loss_rows.shape[0]),
                dict(MEAN=reduction == "mean", BLOCK=1024, num_warps=4))
    return out


def scale_grad_(grad: Tensor, grad_output: Tensor, count: Optional[Tensor] = None) -> None:
    """grad (rows, cols), column stride 1, *= grad_output (a scalar, or one per row) [/ n_valid], in
    place; programs return at once where the factor is exactly 1."""
    if grad.numel() == 0:
        return
    g2 = grad.view(grad.shape[0], -1) if grad.dim() != 2 else grad
    n_rows, n_cols = g2.shape
    per_row = grad_output.dim() == 1
    block_n = min(_next_pow2(n_cols), 4096)
    rows = max(1, 4096 // block_n)
    n_tiles = fastlaunch.cdiv(n_rows, rows) * fastlaunch.cdiv(n_cols, block_n)
    with _device_guard(grad):
        _launch(_scale_kernel, (_persistent_programs(n_tiles, grad.device),),
                (g2, grad_output, count if count is not None else grad_output, n_rows, n_cols, g2.stride(0),
                 grad_output.stride(0) if per_row else 0),
                dict(PER_ROW=per_row, DIVIDE=count is not None, ROWS=rows, BLOCK_N=block_n, num_warps=8))
