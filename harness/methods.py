"""Apply an acceleration method to a built model: swap the softmax (or, for `sdpa`, the attention
core) in every block. The only place where kernels/ and models/ meet."""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

import kernels
from models import MaterializedAttention, SDPAttention, swap_attention_cores


def apply_accel(model: nn.Module, attention: str, softmax: str | None, dropout: float = 0.0) -> Callable[[], None]:
    """Swap every block's attention core; returns a function that restores the previous cores."""
    if attention == "sdpa":
        return swap_attention_cores(model, lambda: SDPAttention(dropout=dropout))
    if attention == "materialized":
        if not softmax:
            raise ValueError("attention='materialized' needs a softmax method name")
        fn = kernels.bind(softmax)
        return swap_attention_cores(model, lambda: MaterializedAttention(fn, dropout=dropout))
    raise ValueError(f"unknown attention core {attention!r}; accepted: materialized, sdpa")
