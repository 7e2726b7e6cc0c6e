"""`compile`: the naive chains through ``torch.compile``.

Softmax: scale, mask, max, sub, exp, sum, div in fp32; cross-entropy: max, sub, exp, sum, log, gather
and the reduction in fp32 (:mod:`kernels.methods.naive`). Inductor fuses each chain into one or two
kernels per direction. Each signature (shapes, strides, dtypes, device and the non-tensor arguments)
gets its own compiled function (its own code object, hence its own Dynamo cache), compiled once on
first use and reused after: repeated shapes never recompile, and many distinct shapes never run into
Dynamo's per-function recompile limit (which would silently fall back to eager). Inside a region that
torch.compile is already tracing (whole-model compile), the chain is inlined.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from kernels.methods.naive import naive_cross_entropy, naive_softmax
from kernels.registry import Method, register

_COMPILED: dict[tuple, Callable] = {}


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


def _fresh_chain(fn: Callable, tag: int) -> Callable:
    code = fn.__code__.replace(co_name=f"compiled_{fn.__name__}_chain_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


def _compiled(fn: Callable, key: tuple) -> Callable:
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = torch.compile(_fresh_chain(fn, len(_COMPILED)), dynamic=False, fullgraph=True)
        _COMPILED[key] = compiled
    return compiled


def compiled_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return naive_softmax(scores, scale, causal)
    return _compiled(naive_softmax, ("softmax", *_layout(scores), causal))(scores, scale, causal)


def compiled_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                           reduction: str) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return naive_cross_entropy(logits, targets, ignore_index, reduction)
    key = ("cross_entropy", *_layout(logits), *_layout(targets), ignore_index, reduction)
    return _compiled(naive_cross_entropy, key)(logits, targets, ignore_index, reduction)


def compiled_signatures() -> int:
    """How many signatures have been compiled so far (tests check shapes repeat without recompiling)."""
    return len(_COMPILED)


register(
    Method(
        name="compile",
        softmax=compiled_softmax,
        cross_entropy=compiled_cross_entropy,
        summary="the naive chains through torch.compile (Inductor-fused), one compile per signature",
    )
)
