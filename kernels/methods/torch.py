"""`torch`: scale + masked fill + ``torch.softmax``, what a PyTorch user writes.

Under bf16 autocast ``torch.softmax`` runs in float32 (autocast's policy), so this method also pays
the dtype-conversion copies that a typical model pays; the result is cast back to the input dtype.
Rows with no unmasked key (causal with Tq > Tk, the first Tq - Tk rows) are zeroed explicitly, since
``torch.softmax`` of an all -inf row is NaN.
"""

from __future__ import annotations

import torch

from kernels.common import causal_mask, fully_masked_rows
from kernels.registry import Method, register


def torch_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    x = scores * scale if scale != 1.0 else scores  # nobody multiplies by one
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        x = x.masked_fill(causal_mask(tq, tk, x.device), float("-inf"))
    y = torch.softmax(x, dim=-1)
    if causal and fully_masked_rows(tq, tk):
        rows = torch.arange(tq, device=y.device) < fully_masked_rows(tq, tk)
        y = y.masked_fill(rows[:, None], 0.0)
    return y.to(scores.dtype)


register(
    Method(
        name="torch",
        softmax=torch_softmax,
        summary="scale + masked_fill + torch.softmax (PyTorch's native kernel)",
    )
)
