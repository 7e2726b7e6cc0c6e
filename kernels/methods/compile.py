"""`compile`: the naive chain (scale, mask, max, sub, exp, sum, div in fp32) through ``torch.compile``.

Inductor fuses the chain into one or two kernels per direction. Each shape/stride/dtype/device/causal
signature gets its own compiled function (its own code object, hence its own Dynamo cache), compiled
once on first use and reused after: repeated shapes never recompile, and many distinct shapes never
run into Dynamo's per-function recompile limit (which would silently fall back to eager).
Inside a region that torch.compile is already tracing (whole-model compile), the chain is inlined.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from kernels.methods.naive import naive_softmax
from kernels.registry import Method, register

_COMPILED: dict[tuple, Callable] = {}


def _signature(scores: torch.Tensor, causal: bool) -> tuple:
    return (tuple(scores.shape), scores.stride(), scores.dtype, scores.device, causal)


def _fresh_chain(tag: int) -> Callable:
    code = naive_softmax.__code__.replace(co_name=f"compiled_softmax_chain_{tag}")
    return types.FunctionType(code, naive_softmax.__globals__, code.co_name)


def compiled_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return naive_softmax(scores, scale, causal)
    key = _signature(scores, causal)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = torch.compile(_fresh_chain(len(_COMPILED)), dynamic=False, fullgraph=True)
        _COMPILED[key] = fn
    return fn(scores, scale, causal)


def compiled_signatures() -> int:
    """How many signatures have been compiled so far (tests check shapes repeat without recompiling)."""
    return len(_COMPILED)


register(
    Method(
        name="compile",
        softmax=compiled_softmax,
        summary="the naive chain through torch.compile (Inductor-fused), one compile per signature",
    )
)
