"""`floor`: NOT a softmax. The scores are only scaled (no max, no exp, no normalization).

A timing-only stand-in (``exact=False``): the same model with the cheapest possible "softmax" shows the
throughput no softmax method can beat (the "no-softmax floor" of a speedup study). It never passes a
correctness gate and is never reported with a speedup; ``available_methods()`` does not list it.
"""

from __future__ import annotations

import torch

from kernels.registry import Method, register


def scale_only(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return scores * scale


register(
    Method(
        name="floor",
        softmax=scale_only,
        summary="timing only: scores scaled, not normalized (the no-softmax floor)",
        exact=False,
    )
)
