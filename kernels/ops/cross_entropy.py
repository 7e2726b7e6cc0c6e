"""``cross_entropy(logits, targets, ignore_index, reduction)``

logits (..., V) in float32/float16/bfloat16, targets (...) int64 (int32 accepted); the loss
-log softmax(logits)[target] per target, float32, accumulated in float32; ``reduction`` "mean" (over
the targets that are not ``ignore_index``), "sum", or "none" (one loss per target, 0 where ignored);
every target ignored gives loss 0 and a zero gradient, never NaN; the gradient in the logits' dtype;
any strides; no cap on V. A target outside [0, V) that is not ``ignore_index`` is an error (checked
here for CPU tensors; on a GPU by the method, on the device). The method's function receives (N, V)
logits and (N,) int64 targets.

The gate checks it on (rows, vocabulary) logits, at most 256 rows, one target in eight ignored.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from kernels.ops.checks import check_float, check_targets, rows, zero_loss
from kernels.ops.op import GateCase, Judged, Lookup, Op, RunShapes
from kernels.reference import BWD_TOL, FWD_TOL, reference_cross_entropy

#: the most rows a gate check takes
GATE_ROWS = 256


def check_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> None:
    """The cross-entropy's input checks (dtype, the logits' shape, the targets and the reduction)."""
    check_float(logits, "logits", "cross_entropy")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy needs logits of shape (..., V) with V >= 1; got {tuple(logits.shape)}")
    check_targets("cross_entropy", targets, tuple(logits.shape[:-1]), logits.shape[-1], logits.device,
                  ignore_index, reduction, "logits")


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def cross_entropy(logits, targets, ignore_index: int = -100, reduction: str = "mean"):
        check_cross_entropy(logits, targets, ignore_index, reduction)
        if validate is not None:
            validate(logits)
        if targets.numel() == 0:
            return zero_loss(reduction, targets.shape, logits)
        out = fn(rows(logits), targets.reshape(-1).long(), int(ignore_index), reduction)
        return out.view(targets.shape) if reduction == "none" else out

    return cross_entropy


def entry(lookup: Lookup) -> Callable:
    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, method: str = "torch", ignore_index: int = -100,
                      reduction: str = "mean", **options: Any) -> torch.Tensor:
        """Cross-entropy of logits (..., V) against integer targets (...) (see :mod:`kernels.ops.cross_entropy`)."""
        return lookup(method, "cross_entropy", options)(logits, targets, ignore_index, reduction)

    return cross_entropy


def gate_targets(shapes: RunShapes, g: torch.Generator) -> torch.Tensor:
    """The gate's targets: (rows,) classes of the vocabulary, one in eight ignored."""
    t = torch.randint(0, shapes.vocab, (min(shapes.tokens, GATE_ROWS),), generator=g)
    t[::8] = -100
    return t.to(shapes.device)


def judge_loss(inputs: list, targets: torch.Tensor, reference: Callable, dtype: torch.dtype) -> Callable:
    """The judge of a loss's gate case: the mean loss and the gradients of ``inputs`` against float64
    (``reference(*float64 inputs, targets)``)."""
    def judge(loss: torch.Tensor) -> Judged:
        ref_in = [x.detach().to(torch.float64).requires_grad_(True) for x in inputs]
        ref = reference(*ref_in, targets)
        ref.backward()
        return Judged([loss.float()] + [x.grad for x in inputs], [ref] + [x.grad for x in ref_in],
                      2 * FWD_TOL[dtype], BWD_TOL[dtype])

    return judge


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """(rows, vocab) logits; the mean loss and the logits' gradient against float64."""
    g = torch.Generator().manual_seed(seed)
    t = gate_targets(shapes, g)
    logits = (torch.randn(len(t), shapes.vocab, generator=g) * 2).to(device=shapes.device, dtype=shapes.dtype)
    logits.requires_grad_(True)
    return GateCase((len(t), shapes.vocab), shapes.dtype, (logits, t, -100, "mean"), None,
                    judge_loss([logits], t, reference_cross_entropy, shapes.dtype))


OP = Op("cross_entropy", "cross_entropy(logits (N, V), targets (N,), ignore_index, reduction)", wrap, entry,
        reference_cross_entropy, gate_case, seam="loss", form="logits")
