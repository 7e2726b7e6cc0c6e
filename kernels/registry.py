"""The softmax contract and the registry of methods that implement it.

Contract (the same for every method), for ``softmax(scores, scale=s, causal=c)``:

* softmax over the last dimension of ``s * scores``; any number of leading dimensions;
* with ``causal=True`` and scores of shape (..., Tq, Tk), key j is masked for query i when
  ``j > i + (Tk - Tq)``; masked entries get probability exactly 0 and gradient exactly 0; a row with
  no unmasked key (possible when Tq > Tk) gives all zeros and zero gradient, never NaN;
* output in the input dtype (float32, float16, bfloat16), accumulation in float32;
* differentiable (forward and backward).

A method is one module in ``kernels/methods/`` that calls :func:`register` at import time, plus one
file in ``conf/accel/``. Nothing else changes when a method is added: the modules are discovered by
:func:`load_methods`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

#: A softmax implementation: ``fn(scores, scale, causal) -> probabilities``.
SoftmaxFn = Callable[[torch.Tensor, float, bool], torch.Tensor]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class UnknownMethodError(ValueError):
    """Raised for a method name that no module registered."""


class MethodUnavailableError(RuntimeError):
    """Raised for a registered method that cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class SoftmaxMethod:
    """One registered softmax implementation.

    ``unavailable_reason`` returns None when the method can run here, else a sentence saying why not.
    ``validate`` (optional) rejects inputs the method cannot take with a clear error.
    ``prepare`` (optional) does one-time work such as building an extension and returns what it cost.
    ``exact=False`` marks a timing-only stand-in that does not compute a softmax (never reported as a
    speedup, never listed as a user-facing method).
    """

    name: str
    fn: SoftmaxFn
    summary: str
    unavailable_reason: Callable[[], Optional[str]] = field(default=lambda: None)
    validate: Optional[Callable[[torch.Tensor], None]] = None
    exact: bool = True
    prepare: Optional[Callable[[], dict]] = None  # one-time setup (a build), timed apart by callers


@dataclass(frozen=True)
class Availability:
    name: str
    available: bool
    reason: str  # why it cannot run here ("" when it can)
    summary: str


_REGISTRY: dict[str, SoftmaxMethod] = {}
_LOADED = False


def register(method: SoftmaxMethod) -> SoftmaxMethod:
    """Add a method to the registry (called by each module in ``kernels/methods/`` at import)."""
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise ValueError(f"softmax method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests register throw-away methods and remove them again)."""
    _REGISTRY.pop(name, None)


def load_methods() -> None:
    """Import every module of ``kernels.methods`` once, so that each registers its method."""
    global _LOADED
    if _LOADED:
        return
    import kernels.methods as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    _LOADED = True


def available_methods(include_timing_only: bool = False) -> dict[str, Availability]:
    """Every registered method with whether it can run here and, if not, why."""
    load_methods()
    out = {}
    for name, m in _REGISTRY.items():
        if not m.exact and not include_timing_only:
            continue
        reason = m.unavailable_reason() or ""
        out[name] = Availability(name, not reason, reason, m.summary)
    return out


def runnable_methods() -> list[str]:
    return [n for n, a in available_methods().items() if a.available]


def get_method(name: str) -> SoftmaxMethod:
    """Look a method up; unknown or not runnable here raises an error that says why and what can run."""
    load_methods()
    method = _REGISTRY.get(name)
    runnable = ", ".join(runnable_methods()) or "none"
    if method is None:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownMethodError(
            f"unknown softmax method {name!r}; registered methods: {known}; runnable here: {runnable}"
        )
    reason = method.unavailable_reason()
    if reason:
        raise MethodUnavailableError(
            f"softmax method {name!r} cannot run here: {reason}. Methods that can run here: {runnable}"
        )
    return method


def check_scores(scores: torch.Tensor, causal: bool) -> None:
    """The input checks shared by every method (dtype, shape)."""
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"softmax expects a torch.Tensor, got {type(scores).__name__}")
    if scores.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(f"softmax got scores of dtype {scores.dtype}; supported dtypes: {names}")
    if scores.dim() == 0:
        raise ValueError("softmax needs at least one dimension (got a 0-d tensor)")
    if scores.shape[-1] == 0:
        raise ValueError(
            f"softmax over an empty last dimension is undefined (scores shape {tuple(scores.shape)})"
        )
    if causal and scores.dim() < 2:
        raise ValueError(
            f"causal softmax needs scores of shape (..., Tq, Tk); got shape {tuple(scores.shape)}"
        )


def bind(method: str) -> SoftmaxFn:
    """Look ``method`` up once and return ``fn(scores, scale, causal)`` that checks its input and runs
    it (what a model calls in its hot loop: no registry lookup per call, traceable by torch.compile)."""
    m = get_method(method)

    def bound(scores: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
        check_scores(scores, causal)
        if m.validate is not None:
            m.validate(scores)
        if scores.numel() == 0:  # empty leading dimensions: nothing to compute
            return scores.clone()  # keeps the autograd graph of an empty input
        return m.fn(scores, float(scale), bool(causal))

    bound.__name__ = f"softmax[{m.name}]"
    return bound


def softmax(
    scores: torch.Tensor, *, scale: float = 1.0, causal: bool = False, method: str = "torch"
) -> torch.Tensor:
    """Softmax over the last dimension of ``scale * scores`` with an optional causal mask.

    See the module docstring for the contract every method follows.
    """
    return bind(method)(scores, scale, causal)
