"""Ops built from the ones a method implements: the compositions the op table names (:mod:`kernels.ops`).

* ``attention`` from a ``softmax``: the materialized rung, exactly what the model's attention did
  before fused attention existed: scores = q k^T (B, H, Tq, Tk) in memory, the method's softmax (scale
  and causal mask fused into it), dropout on the probabilities, then @ v. Grouped k and v (Hkv < H
  heads) by a grouped matmul, never a copy of them: q viewed (B, Hkv, G Tq, d), its G = H / Hkv heads
  of a group stacked, against k (B, Hkv, Tk, d); the scores (B, Hkv, G Tq, Tk) are the same memory as
  (B, H, Tq, Tk), so the softmax sees the layout (and the per-(Tq, Tk) causal mask) it always saw; the
  probabilities go back to (B, Hkv, G Tq, Tk) against v. Autograd's matmul backward then sums each kv
  head's gradient over its group.
* ``attention_qkv`` from an ``attention``: q, k and v split from the projection as views
  (:func:`kernels.layouts.split_qkv`, with n_kv_head where grouped), then the method's attention; the
  backward concatenates their gradients into one (a copy), which a native ``attention_qkv`` avoids.
* ``linear_cross_entropy`` from a ``cross_entropy``: the logits ``hidden @ weight.T`` in memory, then
  the method's cross-entropy.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from kernels.layouts import split_qkv


def attention_from_softmax(softmax: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def attention(q, k, v, scale: float, causal: bool, dropout_p: float, **options) -> torch.Tensor:
        B, H, Tq, d = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        if Hkv != H:  # grouped: q's G heads of a group stacked as rows against their one kv head
            q = q.reshape(B, Hkv, H // Hkv * Tq, d)  # a view of a (B, H, Tq, d)-contiguous q
        scores = (q @ k.transpose(-2, -1)).view(B, H, Tq, Tk)  # (B, H, Tq, Tk)
        p = softmax(scores, scale, causal, **options)  # rows sum to 1
        if dropout_p:
            p = F.dropout(p, dropout_p, training=True)
        if Hkv != H:
            return (p.reshape(B, Hkv, H // Hkv * Tq, Tk) @ v).view(B, H, Tq, v.shape[-1])
        return p @ v  # (B, H, Tq, dv)

    attention.__name__ = f"attention_from[{getattr(softmax, '__name__', 'softmax')}]"
    return attention


def attention_qkv_from_attention(attention: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def attention_qkv(qkv, n_head: int, scale: float, causal: bool, dropout_p: float, n_kv_head: int | None = None,
                      **options) -> torch.Tensor:
        return attention(*split_qkv(qkv, n_head, n_kv_head), scale, causal, dropout_p, **options)

    attention_qkv.__name__ = f"attention_qkv_from[{getattr(attention, '__name__', 'attention')}]"
    return attention_qkv


def linear_from_cross_entropy(cross_entropy: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def linear_cross_entropy(hidden, weight, targets, ignore_index: int, reduction: str, **options) -> torch.Tensor:
        logits = F.linear(hidden, weight)  # (N, V): every logit in memory
        return cross_entropy(logits, targets, ignore_index, reduction, **options)

    linear_cross_entropy.__name__ = f"linear_from[{getattr(cross_entropy, '__name__', 'cross_entropy')}]"
    return linear_cross_entropy
