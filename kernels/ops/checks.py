"""The input checks that several ops' contracts share: float tensors of the supported dtypes, class
targets and reductions, and the helpers a bound op uses around the method's function."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TARGET_DTYPES = (torch.int64, torch.int32)
REDUCTIONS = ("mean", "sum", "none")


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_float(t, what: str, op: str) -> None:
    """``t`` is a tensor of a supported dtype (``what``: its name in ``op``'s error)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op} expects a torch.Tensor for {what}, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op} got {what} of dtype {t.dtype}; supported dtypes: {_dtype_names(SUPPORTED_DTYPES)}")


def check_dropout(op: str, dropout_p: float) -> None:
    """An attention's dropout probability is in [0, 1)."""
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"{op} dropout_p={dropout_p!r} is not accepted: a float in [0, 1)")


def check_targets(op: str, targets, lead_shape: tuple, n_cols: int, device: torch.device, ignore_index: int,
            reduction: str, logits_name: str) -> None:
    """The cross-entropies' target checks: integer targets of the logits' leading shape on their device,
    the reduction, and (CPU tensors) every target in [0, V) or ignore_index."""
    if not isinstance(targets, torch.Tensor) or targets.dtype not in TARGET_DTYPES:
        got = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(f"{op} takes integer class targets (int64 or int32); got {got}")
    if tuple(targets.shape) != lead_shape:
        raise ValueError(
            f"{op}: targets of shape {tuple(targets.shape)} do not match {logits_name} of shape "
            f"{(*lead_shape, n_cols)} (targets must have the logits' shape without the last dimension)"
        )
    if device != targets.device:
        raise ValueError(f"{op} needs its inputs and targets on one device; got {device}, {targets.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op} reduction={reduction!r} is not accepted: one of {', '.join(REDUCTIONS)}")
    if targets.device.type != "cpu" or not targets.numel():  # on a GPU: checked on the device (no sync here)
        return
    bad = ((targets < 0) | (targets >= n_cols)) & (targets != ignore_index)
    msg = f"{op}: a target is outside [0, {n_cols}) and is not ignore_index ({ignore_index})"
    if torch.compiler.is_compiling():  # traced: a check in the graph (a host read would break it)
        torch._assert_async(~bad.any(), msg)
    elif bool(bad.any()):
        first = int(targets[bad].flatten()[0])
        raise ValueError(f"{op}: target {first} is outside [0, {n_cols}) and is not ignore_index ({ignore_index})")


def rows(t: torch.Tensor) -> torch.Tensor:
    """(..., n) as (rows, n): a view when the leading dims flatten, else one copy."""
    return t.reshape(-1, t.shape[-1])


def zero_loss(reduction: str, shape, *tensors: torch.Tensor) -> torch.Tensor:
    """The loss of no targets (0, or an empty per-target loss), connected to the inputs so that their
    gradient is a zero tensor."""
    zero = sum(t.sum() for t in tensors).float() * 0.0
    if reduction == "none":
        return torch.zeros(shape, dtype=torch.float32, device=tensors[0].device) + zero
    return zero

