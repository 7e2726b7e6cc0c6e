"""`naive`: the unfused eager chains, the baseline of every study.

Softmax: scale, masked fill, max, subtract, exp, sum and divide as separate PyTorch ops, in float32
(the contract's accumulation precision), cast back to the input dtype at the end. Every op reads and
writes the whole (rows x N) tensor, so it moves about 10x the bytes of a fused kernel; autograd saves
several intermediates for backward.

Cross-entropy: the same kind of chain over the vocabulary, in float32: max, subtract, exp, sum, log,
gather of the target column, then the reduction over the targets that are not ignored (0 where every
target is: the count is clamped to 1, no host sync). Backward is autograd's through the chain.
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


def naive_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    x = logits.float()  # (N, V); the gradient comes back in the logits' dtype through this cast
    m = x.amax(dim=-1, keepdim=True).detach()  # (the loss does not depend on the shift)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # a row of -inf logits
    z = x - m
    lse = z.exp().sum(dim=-1).log()  # (N,)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))  # ignored rows gather column 0
    zt = z.gather(-1, safe[:, None]).squeeze(-1)
    loss = torch.where(valid, lse - zt, torch.zeros_like(lse))  # (N,), 0 where ignored
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp(min=1)


register(
    Method(
        name="naive",
        softmax=naive_softmax,
        cross_entropy=naive_cross_entropy,
        summary="unfused eager chains in fp32 (softmax: scale, mask, max, sub, exp, sum, div; "
                "cross-entropy: max, sub, exp, sum, log, gather): the baseline",
    )
)
