"""`naive`: the unfused eager chain, the baseline of every study.

Scale, masked fill, max, subtract, exp, sum and divide as separate PyTorch ops, in float32 (the
contract's accumulation precision), cast back to the input dtype at the end. Every op reads and writes
the whole (rows x N) tensor, so it moves about 10x the bytes of a fused kernel; autograd saves several
intermediates for backward.
"""

from __future__ import annotations

import torch

from kernels.common import causal_mask
from kernels.registry import Method, register


def naive_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    x = scores.float() * scale
    if causal:
        x = x.masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # rows with no unmasked key
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    # s >= 1 on any row with a finite maximum; only rows with no unmasked key have s == 0 (-> zeros)
    y = e / s.clamp_min(torch.finfo(torch.float32).tiny)
    return y.to(scores.dtype)


register(
    Method(
        name="naive",
        softmax=naive_softmax,
        summary="unfused eager chain (scale, mask, max, sub, exp, sum, div) in fp32: the baseline",
    )
)
