"""The `cuda` method's ``cross_entropy`` and ``linear_cross_entropy``, built on two CUDA primitives
(``csrc/cross_entropy_binding.cpp``; the kernels and their code paths: ``csrc/cross_entropy/paths.cuh``):

* ``softmax_harness_cuda::ce_rows(logits, targets, ignore_index, grad_scale, grad, path=-1)``: per-row
  losses, and the gradient ``(softmax - onehot) * grad_scale`` written into ``grad`` (which may be the
  logits: in place), reading each logit once and writing each gradient element once;
* ``softmax_harness_cuda::scale_grad_(grad, g)``: ``grad *= g`` (a scalar or one per row), a launch and
  no pass when ``g`` is exactly 1.

``cross_entropy`` and ``linear_cross_entropy``: the drivers of :mod:`.ce_driver` (method-agnostic) on
these primitives, as the torch ops ``softmax_harness::cuda_ce_fwd`` and ``softmax_harness::cuda_lce_fwd``
/ ``_bwd`` (what the forward and the backward compute, the memory, autocast, a second backward: there).
No host-device sync anywhere.

Out-of-range targets (not ignore_index): that row's loss and gradient are NaN and the first such target
is recorded on the device; :func:`check_targets` raises naming it (a device sync: for tests and
debugging; ``SOFTMAX_HARNESS_CE_CHECK=1`` makes every launch check).
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.cuda.build import STATE
from kernels.methods.cuda.ce_driver import make_cross_entropy, make_linear_cross_entropy
from kernels.methods.cuda.op import prepare

_DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: Forced code paths of ce_rows (tests and the sweep); -1: the launch table's choice.
CE_PATHS = {"auto": -1, "register": 0, "hybrid": 1, "split": 2, "stream": 3}


# ------------------------------------------------------------------------------------------------
# the primitives (the driver's interface: see kernels/methods/cuda/ce_driver.py)
# ------------------------------------------------------------------------------------------------
def ce_rows(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, grad_scale: Optional[torch.Tensor] = None,
            grad: Optional[torch.Tensor] = None, path: int = -1) -> torch.Tensor:
    return torch.ops.softmax_harness_cuda.ce_rows(logits, targets, ignore_index, grad_scale, grad, path)


def scale_grad_(grad: torch.Tensor, g: torch.Tensor) -> None:
    torch.ops.softmax_harness_cuda.scale_grad_(grad, g)


def ce_code_path(dtype: torch.dtype, cols: int, aligned: bool = True, rows: int = 1, path: str = "auto") -> str:
    """Which code path ce_rows takes for rows x cols: 'register', 'hybrid', 'split' or 'stream' ('none': a
    forced path that cannot take them). Needs the extension (and, for the split cap, the GPU)."""
    if not STATE["loaded"]:
        prepare()
    return torch.ops.softmax_harness_cuda.ce_path(_DTYPE_CODE[dtype], rows, cols, aligned, CE_PATHS[path])


def check_targets() -> None:
    """Raise if a ce_rows launch on the current device met a target outside [0, V) that was not
    ignore_index since the last check (synchronizes the device)."""
    if not STATE["loaded"]:
        prepare()
    found, row, target, cols = torch.ops.softmax_harness_cuda.ce_take_target_error().tolist()
    if found:
        raise RuntimeError(f"cuda cross_entropy: target {target} (row {row}) is outside [0, {cols}) and is not "
                           "ignore_index; that row's loss and gradient are NaN")


# ------------------------------------------------------------------------------------------------
# the ops (the drivers: kernels/methods/cuda/ce_driver.py)
# ------------------------------------------------------------------------------------------------
_cuda_ce = make_cross_entropy("cuda_ce", ce_rows, scale_grad_)
_cuda_lce = make_linear_cross_entropy("cuda_lce", ce_rows, scale_grad_)


def cuda_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """The op function of ``cross_entropy`` (logits (N, V), targets (N,) int64; see kernels.contract)."""
    if not STATE["loaded"]:
        prepare()
    return _cuda_ce(logits, targets, ignore_index, reduction)


def cuda_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                              reduction: str, chunk_rows: Optional[int] = None) -> torch.Tensor:
    """The op function of ``linear_cross_entropy`` (hidden (N, C), weight (V, C), targets (N,) int64)."""
    if not STATE["loaded"]:
        prepare()
    return _cuda_lce(hidden, weight, targets, ignore_index, reduction, chunk_rows)


cuda_cross_entropy.ops = _cuda_ce.ops
cuda_linear_cross_entropy.ops = _cuda_lce.ops
