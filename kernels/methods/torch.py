"""`torch`: scale + masked fill + ``torch.softmax``, what a PyTorch user writes.

Under bf16 autocast ``torch.softmax`` runs in float32 (autocast's policy), so this method also pays
the dtype-conversion copies that a typical model pays; the result is cast back to the input dtype.
Rows with no unmasked key (causal with Tq > Tk, the first Tq - Tk rows) are zeroed explicitly, since
``torch.softmax`` of an all -inf row is NaN.

Cross-entropy: ``F.cross_entropy`` as a user writes it (under bf16 autocast it runs in float32, with
the upcast copy of the logits that a typical model pays). Its 'mean' of no target is 0 / 0 = NaN;
the contract's 0 is restored by a select on the device (no host sync), whose backward leaves the zero
gradient that ``F.cross_entropy`` already gives there. Outside autocast a 16-bit loss is returned as
float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def torch_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)
    if reduction == "mean":  # every target ignored: 0, not NaN
        loss = torch.where((targets != ignore_index).any(), loss, torch.zeros_like(loss))
    return loss.float()


register(
    Method(
        name="torch",
        softmax=torch_softmax,
        cross_entropy=torch_cross_entropy,
        summary="scale + masked_fill + torch.softmax; F.cross_entropy (PyTorch's native kernels)",
    )
)
