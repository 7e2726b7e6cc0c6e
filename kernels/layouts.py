"""Tensor layouts that a model produces and the kernels' contracts consume, stated once. The one module
of ``kernels`` that ``models`` imports: a model's seam hands the kernels its projection in the layout
the ``attention_qkv`` contract is stated in (``kernels`` imports nothing of a model). Pure torch: it
loads no method.

The fused attention projection: ``nn.Linear(C, 3 C)`` (GPT-2's ``c_attn``) writes q, k and v side by
side on its last dimension, each C = n_head * d wide and split into heads. The model splits it for
any attention core on q, k, v; the ``attention_qkv`` op's contract is the attention of these views.
"""

from __future__ import annotations

import torch


def split_qkv(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, n_head, T, d) as views of the projection's output qkv (B, T, 3 n_head d): no copy."""
    B, T, C3 = qkv.shape
    return tuple(t.view(B, T, n_head, C3 // (3 * n_head)).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
