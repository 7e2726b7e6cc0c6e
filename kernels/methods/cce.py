"""`cce`: Apple's Cut Cross-Entropy as shipped (``cut-cross-entropy``, a small Triton package), a public
peer of the fused linear cross-entropies, measured beside Liger's and the project's in the same run.
Needs ``cut-cross-entropy`` (the optional ``bench`` extra: ``pip install -e '.[bench]'``) and a CUDA GPU:
its kernels do not run in Triton's CPU interpreter. Unavailable, with the reason, otherwise.

* ``linear_cross_entropy``: ``cut_cross_entropy.linear_cross_entropy`` (its ``cce`` implementation):
  the log-sum-exp of ``hidden @ weight.T`` computed block by block in SRAM, the logits never in global
  memory, the backward recomputing them. Targets equal to ``ignore_index`` are dropped before its kernels
  (CCE's own ignore_index); ``reduction`` mean / sum / none as the contract's, the per-target losses of
  'none' with 0 where ignored. The loss comes back as float32.
* Approximate by design: as shipped, its backward skips the blocks of the vocabulary whose softmax is
  below the inputs' dtype's epsilon / 32 everywhere (gradient filtering, ``filter_eps='high'``), so the
  correctness gate leaves it out and a study judges it by loss parity alone.
* Under ``torch.autocast`` hidden and weight (the fp32 parameter) are cast to the autocast dtype first, as
  ``F.linear`` would (CCE's kernels take one dtype); outside autocast they must share one.

The contract's corner case where CCE differs (every target ignored gives NaN under 'mean') is left as
shipped, as for ``liger``: the peer as a user gets it, and parity says when it matters.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

from kernels import linear_ce
from kernels.registry import Method, register


def unavailable_reason() -> Optional[str]:
    if importlib.util.find_spec("cut_cross_entropy") is None:
        return ("cut-cross-entropy is not installed (pip install cut-cross-entropy, or the project's 'bench' "
                "extra)")
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU and none was found (its Triton kernels do not run in Triton's CPU interpreter)"
    return None


def cce_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                             reduction: str) -> torch.Tensor:
    """The method's op function (hidden (N, C), weight (V, C), int64 targets (N,), already checked)."""
    from cut_cross_entropy import linear_cross_entropy  # (lazy: an optional dependency that imports Triton kernels)

    hidden, weight = linear_ce.compute_pair(hidden, weight, "linear_cross_entropy[cce]")  # (CCE takes one dtype)
    loss = linear_cross_entropy(hidden, weight, targets, ignore_index=ignore_index, reduction=reduction, impl="cce")
    return loss.float()


register(
    Method(
        name="cce",
        linear_cross_entropy=cce_linear_cross_entropy,
        summary="Apple's Cut Cross-Entropy as shipped: the fused linear cross-entropy of a public peer",
        unavailable_reason=unavailable_reason,
        peer=True,
        approximate=True,
    )
)
