"""`floor`: NOT a softmax. The scores are only scaled (no max, no exp, no normalization).

A timing-only stand-in (``exact=False``): the same model with the cheapest possible "softmax" shows the
throughput no softmax method can beat (the "no-softmax floor" of a speedup study). It never passes a
correctness gate and is never reported with a speedup; ``available_methods()`` does not list it.

Both softmaxes have a floor:

* ``softmax`` (the attention's): the scores scaled, one read and one write, as a fused softmax's forward.
* ``cross_entropy`` (the loss's): NOT a loss. The forward reads the logits once and writes a
  gradient-shaped tensor once (the logits scaled by 1 / rows: what a fused loss kernel that computes its
  gradient in the forward cannot go below), the "loss" is the mean of the first logit of each row; the
  backward hands that tensor back untouched (grad_output ignored). The loss seam's floor, so a study
  can put "attention + loss" methods beside a floor that has both.
"""

from __future__ import annotations

import torch

from kernels.registry import Method, register


def scale_only(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return scores * scale


class _LossFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, rows_of):
        g = logits * (1.0 / max(1, rows_of))  # one read, one write: the fused loss's forward traffic
        ctx.save_for_backward(g)
        return logits[..., 0].float()

    @staticmethod
    def backward(ctx, grad_rows):
        g, = ctx.saved_tensors
        return g, None  # (grad_output ignored: timing only)


def read_once(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    rows = _LossFloor.apply(logits, logits[..., 0].numel())
    return rows if reduction == "none" else rows.sum() if reduction == "sum" else rows.mean()


register(
    Method(
        name="floor",
        softmax=scale_only,
        cross_entropy=read_once,
        summary="timing only: scores scaled, not normalized; logits read once, no loss (the no-softmax floor)",
        exact=False,
    )
)
