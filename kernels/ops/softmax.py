"""``softmax(scores, scale, causal)``

Softmax over the last dimension of ``scale * scores``; any number of leading dimensions; with
``causal=True`` and scores of shape (..., Tq, Tk), key j is masked for query i when
``j > i + (Tk - Tq)``; masked entries get probability exactly 0 and gradient exactly 0; a row with no
unmasked key (possible when Tq > Tk) gives all zeros and zero gradient, never NaN; output in the input
dtype (float32, float16, bfloat16), accumulation in float32; differentiable.

At a run's shapes the gate checks it on (1, heads, T, T) causal scores scaled by 1/sqrt(head dim):
the scores of the attention composed from it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from kernels.ops.checks import check_float
from kernels.ops.op import GateCase, Judged, Lookup, Op, RunShapes
from kernels.reference import reference_softmax, tolerance


def check_scores(scores: torch.Tensor, causal: bool) -> None:
    """The softmax's input checks (dtype, shape)."""
    check_float(scores, "scores", "softmax")
    if scores.dim() == 0:
        raise ValueError("softmax needs at least one dimension (got a 0-d tensor)")
    if scores.shape[-1] == 0:
        raise ValueError(f"softmax over an empty last dimension is undefined (scores shape {tuple(scores.shape)})")
    if causal and scores.dim() < 2:
        raise ValueError(f"causal softmax needs scores of shape (..., Tq, Tk); got shape {tuple(scores.shape)}")


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def softmax(scores: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
        check_scores(scores, causal)
        if validate is not None:
            validate(scores)
        if scores.numel() == 0:  # empty leading dimensions: nothing to compute
            return scores.clone()  # keeps the autograd graph of an empty input
        return fn(scores, float(scale), bool(causal))

    return softmax


def entry(lookup: Lookup) -> Callable:
    def softmax(scores: torch.Tensor, *, scale: float = 1.0, causal: bool = False, method: str = "torch",
                **options: Any) -> torch.Tensor:
        """Softmax over the last dimension of ``scale * scores`` with an optional causal mask (see
        :mod:`kernels.ops.softmax`)."""
        return lookup(method, "softmax", options)(scores, scale, causal)

    return softmax


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """Fresh random causal scores (1, heads, T, T); the output and the input gradient against float64, each
    within the dtype's tolerance (or 3x the error of merely rounding the exact result to the dtype,
    whichever is larger), and the output in the input's shape and dtype."""
    shape, dtype, scale = (1, heads, shapes.seq_len, shapes.seq_len), shapes.dtype, shapes.head_dim ** -0.5
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(device=shapes.device, dtype=dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(device=shapes.device, dtype=dtype)

    def judge(y: torch.Tensor) -> Judged:
        x64 = x.detach().to(torch.float64).requires_grad_(True)
        ref = reference_softmax(x64, scale=scale, causal=True)
        ref.backward(dy.to(torch.float64))
        differs = f"output {tuple(y.shape)} {y.dtype} differs from input {tuple(x.shape)} {x.dtype}"
        return Judged([y, x.grad], [ref, x64.grad], tolerance("fwd", dtype, ref.detach()),
                      tolerance("bwd", dtype, x64.grad), [] if (y.shape, y.dtype) == (x.shape, x.dtype) else [differs])

    return GateCase(shape, dtype, (x, scale, True), dy, judge)


OP = Op("softmax", "softmax(scores, scale, causal)", wrap, entry, reference_softmax, gate_case)
