"""`liger`: Liger-Kernel's Triton kernels as shipped (the best public peer of the fused methods),
measured beside them in the same run. Needs ``liger-kernel`` (the optional ``bench`` extra:
``pip install -e '.[bench]'``); unavailable, with the reason, where it is not installed.

* ``softmax``: Liger's softmax kernel (one row per program; rows over 65536 columns in its multi-block
  path) on the scaled, masked scores: the scale and the causal mask are separate PyTorch ops, since
  Liger's softmax fuses neither. Rows with no unmasked key (Tq > Tk) are zeroed afterwards, as the
  contract asks (Liger gives NaN there).
* ``cross_entropy``: ``LigerCrossEntropyFunction`` (the gradient computed in the forward pass and
  stored in place of the logits, so the logits it receives are overwritten: this method passes a copy
  when they are (a view of) a leaf tensor the caller holds; a model's logits are an intermediate, used
  in place). Its per-target losses come back in the logits' dtype (bf16 rounding), not float32.
* ``linear_cross_entropy``: ``LigerFusedLinearCrossEntropyFunction`` (chunked over tokens).

The contract's corner cases where Liger differs (all targets ignored gives NaN under 'mean') are left
as shipped: this is the peer as a user gets it, and the gate and the parity check say when it fails.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

from kernels.common import causal_mask, fully_masked_rows
from kernels.registry import Method, register


def unavailable_reason() -> Optional[str]:
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel, or the project's 'bench' extra)"
    if not torch.cuda.is_available():
        import os

        if os.environ.get("TRITON_INTERPRET", "0") != "1":
            return "it needs a CUDA GPU and none was found (TRITON_INTERPRET=1 runs Triton's CPU interpreter)"
    return None


def liger_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    x = scores * scale if scale != 1.0 else scores
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        x = x.masked_fill(causal_mask(tq, tk, x.device), float("-inf"))
    y = LigerSoftmaxFunction.apply(x)
    if causal and fully_masked_rows(tq, tk):
        rows = torch.arange(tq, device=y.device) < fully_masked_rows(tq, tk)
        y = y.masked_fill(rows[:, None], 0.0)
    return y


def liger_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    base = logits if logits._base is None else logits._base
    if base.is_leaf:  # Liger writes the gradient over its input: keep logits the caller holds (a model's
        logits = logits.clone()  # logits are an intermediate nobody reads after the loss)
    loss = LigerCrossEntropyFunction.apply(logits.contiguous(), targets, None, ignore_index, 0.0, 0.0, reduction)[0]
    return loss.float()


def liger_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                               reduction: str) -> torch.Tensor:
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    out = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, targets, None, None, ignore_index, 0.0, 0.0,
                                                     reduction)
    return (out[0] if isinstance(out, tuple) else out).float()


register(
    Method(
        name="liger",
        softmax=liger_softmax,
        cross_entropy=liger_cross_entropy,
        linear_cross_entropy=liger_linear_cross_entropy,
        summary="Liger-Kernel's Triton softmax and (fused linear) cross-entropy as shipped: the public peer",
        unavailable_reason=unavailable_reason,
        peer=True,
    )
)
