"""Tensor layouts that a model produces and the kernels' contracts consume, stated once. The one module
of ``kernels`` that ``models`` imports: a model's seam hands the kernels its projection in the layout
the ``attention_qkv`` contract is stated in (``kernels`` imports nothing of a model). Pure torch: it
loads no method.

The fused attention projection: ``nn.Linear(C, (H + 2 Hkv) d)`` writes q (H heads), k and v (Hkv heads
each) side by side on its last dimension, each split into heads of d (GPT-2's ``c_attn``: Hkv = H,
width 3 C). The model splits it for any attention core on q, k, v; the ``attention_qkv`` op's
contract is the attention of these views.

Grouped-query attention: query head h reads kv head h // (H / Hkv) (SDPA's ``enable_gqa``, Hugging
Face's ``repeat_kv``).
"""

from __future__ import annotations

from typing import Optional

import torch


def split_qkv(qkv: torch.Tensor, n_head: int,
              n_kv_head: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, n_head, T, d), k and v (B, n_kv_head, T, d) as views of the projection's output qkv
    (B, T, (n_head + 2 n_kv_head) d): no copy. ``n_kv_head`` None means ``n_head``."""
    kv = n_head if n_kv_head is None else n_kv_head
    B, T, width = qkv.shape
    d = width // (n_head + 2 * kv)
    return tuple(t.view(B, T, t.shape[-1] // d, d).transpose(1, 2)
                 for t in qkv.split([n_head * d, kv * d, kv * d], dim=2))


def expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """k or v (B, Hkv, T, d) as (B, Hkv * groups, T, d), query head h on kv head h // groups (a copy
    unless groups == 1): what a reference or a core without grouped heads reads."""
    if groups == 1:
        return x
    B, Hkv, T, d = x.shape
    return x[:, :, None].expand(B, Hkv, groups, T, d).reshape(B, Hkv * groups, T, d)
