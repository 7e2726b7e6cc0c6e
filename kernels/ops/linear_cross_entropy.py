"""``linear_cross_entropy(hidden, weight, targets, ignore_index, reduction)``

The cross-entropy of ``hidden @ weight.T`` (hidden (..., C), weight (V, C)) with gradients for hidden
and weight, as :mod:`kernels.ops.cross_entropy` states it; a method that implements it natively never
holds all the logits at once. The method's function receives (N, C) hidden states and (N,) int64
targets.

Composed from a method's cross-entropy where it has none of its own (the logits in memory:
:func:`kernels.compose.linear_from_cross_entropy`). The gate checks it on (rows, n_embd) hidden states
and a (vocabulary, n_embd) head weight, the targets as the cross-entropy's.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from kernels.compose import linear_from_cross_entropy
from kernels.ops.checks import check_float, check_targets, rows, zero_loss
from kernels.ops.cross_entropy import gate_targets, judge_loss
from kernels.ops.op import GateCase, Lookup, Op, RunShapes
from kernels.reference import reference_cross_entropy


def check_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               ignore_index: int, reduction: str) -> None:
    """The linear cross-entropy's input checks (dtypes, shapes, devices, the targets and the reduction)."""
    check_float(hidden, "hidden", "linear_cross_entropy")
    check_float(weight, "weight", "linear_cross_entropy")
    if hidden.dim() == 0 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        raise ValueError(
            f"linear_cross_entropy needs hidden (..., C) and weight (V, C) with V >= 1; got hidden "
            f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}"
        )
    if hidden.device != weight.device:
        raise ValueError(f"linear_cross_entropy needs hidden and weight on one device; got {hidden.device}, {weight.device}")
    check_targets("linear_cross_entropy", targets, tuple(hidden.shape[:-1]), weight.shape[0], hidden.device,
                  ignore_index, reduction, "hidden @ weight.T")


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def linear_cross_entropy(hidden, weight, targets, ignore_index: int = -100, reduction: str = "mean"):
        check_linear_cross_entropy(hidden, weight, targets, ignore_index, reduction)
        if validate is not None:
            validate(hidden)
        if targets.numel() == 0:
            return zero_loss(reduction, targets.shape, hidden, weight)
        out = fn(rows(hidden), weight, targets.reshape(-1).long(), int(ignore_index), reduction)
        return out.view(targets.shape) if reduction == "none" else out

    return linear_cross_entropy


def entry(lookup: Lookup) -> Callable:
    def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                             method: str = "torch", ignore_index: int = -100, reduction: str = "mean",
                             **options: Any) -> torch.Tensor:
        """The cross-entropy of ``hidden @ weight.T`` without holding all the logits at once where the
        method implements it natively (see :mod:`kernels.ops.linear_cross_entropy`)."""
        return lookup(method, "linear_cross_entropy", options)(hidden, weight, targets, ignore_index, reduction)

    return linear_cross_entropy


def reference_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                                   ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """The contract in float64 (differentiable): the cross-entropy's reference of ``hidden @ weight.T``."""
    logits = hidden.to(torch.float64) @ weight.to(torch.float64).T
    return reference_cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """(rows, n_embd) hidden states and a (vocab, n_embd) weight; the mean loss and both gradients against
    float64."""
    g = torch.Generator().manual_seed(seed)
    t = gate_targets(shapes, g)
    n, dev, dtype = len(t), shapes.device, shapes.dtype
    hidden = torch.randn(n, shapes.n_embd, generator=g).to(device=dev, dtype=dtype).requires_grad_(True)
    weight = (torch.randn(shapes.vocab, shapes.n_embd, generator=g) * 0.05).to(device=dev, dtype=dtype)
    weight.requires_grad_(True)
    return GateCase((n, shapes.n_embd, shapes.vocab), dtype, (hidden, weight, t, -100, "mean"), None,
                    judge_loss([hidden, weight], t, reference_linear_cross_entropy, dtype))


OP = Op("linear_cross_entropy",
        "linear_cross_entropy(hidden (N, C), weight (V, C), targets (N,), ignore_index, reduction)", wrap, entry,
        reference_linear_cross_entropy, gate_case, composed_from="cross_entropy", compose=linear_from_cross_entropy,
        seam="loss", form="linear")
