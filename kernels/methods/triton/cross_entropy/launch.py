"""Launch settings and the launcher of the ``triton`` cross-entropy's row kernels: the path constants,
:class:`Plan` and :func:`plan` (by row length V; module constants, so tests can force a path),
:func:`launch_ce` (one pass over the rows: loss rows and, when asked, the gradient written once), and what
the ops call: :func:`forward` and :func:`recompute_grad`. The paths: the package docstring
(``kernels/methods/triton/cross_entropy/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from kernels.methods.triton.cross_entropy.gluon import HYBRID_MAX_N, HYBRID_MIN_N, hybrid_unusable, launch_hybrid
from kernels.methods.triton.cross_entropy.kernels import _ce_split_kernel, _ce_stream_kernel, _ce_tile_kernel
from kernels.methods.triton.cross_entropy.reduction import (  # noqa: F401  (re-exported: the module's API)
    _device_guard, count_targets, reduce_loss, scale_grad_)
from kernels.methods.triton.cross_entropy.slices import (default_slices, launch_slices, slices_reason, slices_shape,
                                                         slices_unusable)
from kernels.methods.triton.softmax.plan import _next_pow2
from kernels.runtime import fastlaunch
from kernels.runtime.availability import interpreter_enabled, require_gpu_tensor

#: Rows up to this many columns are held whole in one program's registers (32 fp32 values per thread
#: at 16 warps; 32768 would need 32 warps at 64 registers a thread, one program per SM).
TILE_MAX_N = 16384
#: Rows longer than TILE_MAX_N: "hybrid" (16-bit rows of HYBRID_MIN_N + 1 .. HYBRID_MAX_N columns where
#: ``hybrid_unusable`` says None, the H200 sweep's winner in its range (``python -m
#: harness.bench triton-ce-sweep``; docs/perf.md: 0.95-0.97 of copy at V = 50304-65536, against 0.62
#: for the stream path); longer 16-bit rows: the slices path where ``slices_unusable`` says None
#: (0.83 at 128256-262144); the stream path elsewhere), "stream" (every long row: 0.59 of copy at
#: 128256-262144, against 0.35-0.53 for the split path's best) or "split" (tests force it).
LONG_PATH = "hybrid"
#: Hybrid path warps: 8 (the sweep: 0.824 ms at V = 50304 against 1.094 at 16 warps; 1.004 against
#: 0.986 at 65536).
HYBRID_CE_WARPS = 8
#: Slices path warps (8: as the hybrid path; the sweep also times 16, which spills a few registers).
SLICES_WARPS = 8
#: Split path: chunk length, warps, most chunks per row (each a resident program while the row waits).
SPLIT_BLOCK_N = 8192
SPLIT_WARPS = 8
MAX_SPLITS = 128
#: Stream path: chunk length and warps (the sweep: 2048 x 8 warps best at every V it timed).
STREAM_BLOCK_N = 2048
STREAM_WARPS = 8
#: Tile path (rows per program, warps) by block length: the softmax forward's H200 table (the same
#: bytes per element) as a start; other lengths: ~4096 elements per program.
_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8),
         8192: (1, 16), 16384: (1, 16)}


def validate(x: Tensor) -> None:
    require_gpu_tensor(x, "the triton cross-entropy")


@dataclass(frozen=True)
class Plan:
    """How one launch covers the rows: ``path`` is 'tile' (``rows`` rows of ``block_n`` per program),
    'split' (chunks of ``block_n``, one program each), 'stream' or 'hybrid' (one program per row) or
    'slices' (``slices`` slices of at most ``block_n`` columns a row, one program each)."""

    path: str
    block_n: int
    rows: int = 1
    num_warps: int = 4
    slices: int = 0


def plan(n_cols: int, n_rows: int = 1 << 30, elem_bytes: int = 2, hybrid: bool = True) -> Plan:
    """Launch settings by row length (module constants, so tests can force a path). hybrid=False: the
    plan for rows the hybrid or slices path cannot take (see ``hybrid_unusable``, ``slices_unusable``)."""
    block_n = _next_pow2(n_cols)
    if block_n <= TILE_MAX_N:
        if block_n in _TILE:
            rows, warps = _TILE[block_n]
        else:  # short rows: ~4096 elements per program, 16 per thread
            rows = max(1, min(1024, 4096 // block_n))
            warps = max(1, min(8, rows * block_n // 512))
        rows = min(rows, _next_pow2(n_rows))  # (no programs of mostly missing rows)
        warps = max(1, min(warps, rows * block_n // 256))
        return Plan("tile", block_n, rows, warps)
    if LONG_PATH == "hybrid" and hybrid and elem_bytes == 2 and HYBRID_MIN_N < n_cols <= HYBRID_MAX_N:
        return Plan("hybrid", block_n, 1, HYBRID_CE_WARPS)
    if LONG_PATH == "hybrid" and hybrid and elem_bytes == 2 and n_cols > HYBRID_MAX_N:
        p = slices_plan(n_cols, default_slices(n_cols), SLICES_WARPS)
        if p is not None:
            return p
    if LONG_PATH == "split" and -(-n_cols // SPLIT_BLOCK_N) <= MAX_SPLITS:
        return Plan("split", SPLIT_BLOCK_N, 1, SPLIT_WARPS)
    return Plan("stream", STREAM_BLOCK_N, 1, STREAM_WARPS)


def slices_plan(n_cols: int, n_slices: int, num_warps: int) -> Optional[Plan]:
    """The slices plan of rows of n_cols columns in n_slices slices (None where ``slices_reason`` says
    they cannot be cut so); block_n: the slice length."""
    if slices_reason(n_cols, n_slices, num_warps):
        return None
    return Plan("slices", slices_shape(n_cols, n_slices, num_warps)[0], 1, num_warps, n_slices)


def unusable(logits: Tensor, grad: Optional[Tensor], p: Plan) -> Optional[str]:
    """Why the Gluon plan p (hybrid, slices) cannot take these rows (None: it can, or p is no Gluon plan)."""
    if p.path == "hybrid":
        return hybrid_unusable(logits, grad, p.num_warps)
    if p.path == "slices":
        return slices_unusable(logits, grad, p.num_warps, p.slices)
    return None


def launch_ce(logits: Tensor, targets: Tensor, loss_rows: Optional[Tensor], grad: Optional[Tensor],
              ignore_index: int, scale: Optional[Tensor] = None, count: Optional[Tensor] = None,
              p: Optional[Plan] = None) -> None:
    """One cross-entropy pass over logits (n, V) (any strides): loss rows (fp32; None: not written)
    and, when ``grad`` is given ((n, V), column stride 1; may be ``logits`` itself), the gradient
    (softmax - onehot) times ``scale`` (None: 1; one value, or one per row) / max(``count``, 1)
    (None: not divided)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    if grad is not None and grad.stride(1) != 1:
        raise ValueError("launch_ce writes gradients with column stride 1")
    if p is None:
        p = plan(n_cols, n_rows, logits.element_size())
        if unusable(logits, grad, p):
            p = plan(n_cols, n_rows, logits.element_size(), hybrid=False)
    else:  # (a hybrid or slices plan asked for by name: an error, not another path)
        why = unusable(logits, grad, p)
        if why:
            raise ValueError(why)
    dummy = logits if grad is None else grad
    stride_s = scale.stride(0) if (scale is not None and scale.dim() == 1 and scale.numel() > 1) else 0
    flags = dict(FROM_S=scale is not None, DIVIDE=count is not None, WRITE_LOSS=loss_rows is not None,
                 WRITE_GRAD=grad is not None, num_warps=p.num_warps)
    args = (logits, targets, logits if loss_rows is None else loss_rows, dummy,
            logits if scale is None else scale, logits if count is None else count)
    strides = (logits.stride(0), logits.stride(1), dummy.stride(0), stride_s, ignore_index)
    with _device_guard(logits):
        if p.path == "tile":
            _ce_tile_kernel[(fastlaunch.cdiv(n_rows, p.rows),)](
                *args, n_rows, n_cols, *strides, BLOCK_N=p.block_n, ROWS=p.rows, **flags)
        elif p.path == "split":
            splits = -(-n_cols // p.block_n)
            programs = n_rows * splits
            if programs >= 2**31:
                raise ValueError(f"too many row chunks for one launch ({n_rows} rows x {splits} chunks)")
            stat = torch.empty(programs * 2, dtype=torch.float32, device=logits.device)
            meta = dict(BLOCK_N=p.block_n, SPLITS_P2=_next_pow2(splits), **flags)
            if interpreter_enabled():  # programs run one after another: partials first, then outputs
                cnt = torch.zeros(1, dtype=torch.int32, device=logits.device)
                for phase in (1, 2):
                    _ce_split_kernel[(programs,)](*args, cnt, stat, n_cols, splits, *strides, PHASE=phase, **meta)
            else:
                cnt = torch.zeros(n_rows + 1, dtype=torch.int32, device=logits.device)
                _ce_split_kernel[(programs,)](*args, cnt, stat, n_cols, splits, *strides, PHASE=0, **meta)
        elif p.path == "hybrid":
            launch_hybrid(logits, targets, loss_rows, grad, scale, count, stride_s, ignore_index, p.num_warps,
                          {k: v for k, v in flags.items() if k != "num_warps"})
        elif p.path == "slices":
            launch_slices(logits, targets, loss_rows, grad, scale, count, stride_s, ignore_index, p.num_warps,
                          p.slices, {k: v for k, v in flags.items() if k != "num_warps"})
        elif p.path == "stream":
            _ce_stream_kernel[(n_rows,)](*args, n_cols, *strides, BLOCK_N=p.block_n, **flags)
        else:
            raise ValueError(f"unknown cross-entropy path {p.path!r}")


def defers_scale(dtype: torch.dtype) -> bool:
    """Whether the forward leaves 1 / n_valid to the backward (float16: see the module docstring)."""
    return dtype == torch.float16


def forward(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, compute_grad: bool,
            p: Optional[Plan] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(loss rows, n_valid, gradient or an empty tensor) of logits (N, V)."""
    n_rows, n_cols = logits.shape
    count = count_targets(targets, n_cols, ignore_index)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device) if compute_grad else None
    mean_now = reduction == "mean" and not defers_scale(logits.dtype)
    launch_ce(logits, targets, loss_rows, grad, ignore_index, count=count if mean_now else None, p=p)
    return loss_rows, count, grad if grad is not None else logits.new_empty(0)


def recompute_grad(logits: Tensor, targets: Tensor, count: Tensor, grad_output: Tensor, ignore_index: int,
                   reduction: str, p: Optional[Plan] = None) -> Tensor:
    """The gradient from the logits again, grad_output (and 1 / n_valid) folded in: one read, one write."""
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    go = grad_output.float().reshape(-1)  # (1,) or (N,)
    launch_ce(logits, targets, None, grad, ignore_index, scale=go,
              count=count if reduction == "mean" else None, p=p)
    return grad
