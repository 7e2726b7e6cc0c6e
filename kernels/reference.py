"""Float64 references of the op contracts, used by tests and by the start-up correctness gate."""

from __future__ import annotations

import torch

from kernels.common import causal_offset
from kernels.layouts import expand_kv


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


#: ||out - ref|| / ||ref|| bounds by output dtype (bf16 keeps 8 mantissa bits): forward, backward.
FWD_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BWD_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error of the exact result merely rounded to ``dtype``: no kernel can beat it (fp16 outputs
    of long rows are subnormal, so this can exceed the nominal tolerance)."""
    return relative_error(ref.to(dtype), ref)


def tolerance(kind: str, dtype: torch.dtype, ref: torch.Tensor | None = None) -> float:
    """The accepted relative error of a ``"fwd"`` or ``"bwd"`` result: the dtype's bound, or 3x the
    rounding floor of ``ref`` (the exact result) when that is larger."""
    base = (FWD_TOL if kind == "fwd" else BWD_TOL)[dtype]
    return base if ref is None else max(base, 3 * rounding_floor(ref, dtype))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                        causal: bool = True) -> torch.Tensor:
    """The attention contract in float64 (differentiable): softmax(scale * q k^T, causal) v, queries
    with no key get zeros; k and v with Hkv heads dividing q's H: query head h reads kv head
    h // (H / Hkv) (the gradients of k and v summed over their group)."""
    groups = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.to(torch.float64), expand_kv(k.to(torch.float64), groups), expand_kv(v.to(torch.float64), groups)
    s = 1.0 / (q.shape[-1] ** 0.5) if scale is None else scale
    p = reference_softmax(q64 @ k64.transpose(-2, -1), scale=s, causal=causal)
    return p @ v64


#: ||out - ref|| / ||ref|| bounds of attention by dtype (the probabilities are rounded to the dtype
#: before the second matmul in every fused kernel): output, input gradients.
ATTN_FWD_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2.5e-2}
ATTN_BWD_TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                            reduction: str = "mean") -> torch.Tensor:
    """The cross-entropy contract in float64 (differentiable): logsumexp(x) - x[target] per target,
    0 where the target is ``ignore_index``; 'mean' over the other targets (0 when there are none),
    'sum', or 'none' (the targets' shape)."""
    x = logits.to(torch.float64)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets)).long()
    xt = x.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    loss = torch.where(valid, torch.logsumexp(x, dim=-1) - xt, torch.zeros_like(xt))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp(min=1)
