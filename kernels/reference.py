"""Float64 reference of the softmax contract, used by tests and by the start-up correctness gate."""

from __future__ import annotations

import torch

from kernels.common import causal_offset


def reference_softmax(scores: torch.Tensor, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """Softmax of ``scale * scores`` over the last dim, computed in float64 (differentiable).

    Masked entries (and whole rows with no unmasked key) are exactly zero; NaN propagates within a row;
    a row whose scores are all -inf behaves like a fully masked row (zeros).
    """
    x = scores.to(torch.float64) * scale
    masked = torch.zeros(x.shape[-1:], dtype=torch.bool, device=x.device)
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        i = torch.arange(tq, device=x.device)[:, None]
        j = torch.arange(tk, device=x.device)[None, :]
        masked = j > i + causal_offset(tq, tk)
    x = x.masked_fill(masked, float("-inf"))
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m).detach()
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def reference_softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, *, scale: float = 1.0
) -> torch.Tensor:
    """dx = scale * y * (dy - sum(dy * y)) in float64 (y is the softmax output)."""
    y64, dy64 = y.to(torch.float64), dy.to(torch.float64)
    return scale * y64 * (dy64 - (dy64 * y64).sum(dim=-1, keepdim=True))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has NaN where ref has none)."""
    out64, ref64 = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    return diff / denom if denom > 0 else diff
