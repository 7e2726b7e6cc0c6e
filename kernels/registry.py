"""The registry of acceleration methods and the ops each implements.

A method is one module in ``kernels/methods/`` that calls :func:`register` at import time with a
:class:`Method`, plus one file in ``conf/accel/``. Nothing else changes when a method is added: the
modules are discovered by :func:`load_methods`, and studies and benchmarks list every method that
can run here.

A method implements one or more ops (:data:`OPS`); the contracts are in :mod:`kernels.contract`. An op
it lacks is composed from the ones it has (:mod:`kernels.compose`): ``attention`` from its ``softmax``
(q k^T -> softmax -> v), ``attention_qkv`` from its ``attention`` (split the projection into views),
``linear_cross_entropy`` from its ``cross_entropy`` (linear -> cross_entropy). :func:`bind` returns the
checked hot-path function of one op, cached per (method, op, options); availability is computed once per
process (:func:`refresh` asks again).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import torch

from kernels import compose, contract

#: The ops a method may implement, in the order they are listed.
OPS = ("softmax", "attention", "attention_qkv", "cross_entropy", "linear_cross_entropy")
#: How an op a method lacks is built from one it has (that one native or itself composed).
COMPOSED_FROM = {"attention": "softmax", "attention_qkv": "attention", "linear_cross_entropy": "cross_entropy"}
#: Ops that are another op on other views of its inputs, listed (``Method.ops``) only where implemented.
VARIANTS = ("attention_qkv",)
_COMPOSE = {"attention": compose.attention_from_softmax, "attention_qkv": compose.attention_qkv_from_attention,
            "linear_cross_entropy": compose.linear_from_cross_entropy}

SUPPORTED_DTYPES = contract.SUPPORTED_DTYPES


class UnknownMethodError(ValueError):
    """Raised for a method name that no module registered."""


class MethodUnavailableError(RuntimeError):
    """Raised for a registered method that cannot run on this machine (the message says why)."""


class OpNotImplementedError(ValueError):
    """Raised for an op a method neither implements nor can compose from the ops it has."""


def _runs_everywhere() -> Optional[str]:
    return None


@dataclass(frozen=True)
class Method:
    """One registered acceleration method.

    Op functions take their arguments positionally, already checked against the op's contract
    (:mod:`kernels.contract`): ``softmax(scores, scale, causal)``, ``attention(q, k, v, scale, causal,
    dropout_p)``, ``attention_qkv(qkv (B, T, 3 H d), n_head, scale, causal, dropout_p)``,
    ``cross_entropy(logits (N, V), targets (N,), ignore_index, reduction)``,
    ``linear_cross_entropy(hidden (N, C), weight (V, C), targets (N,), ignore_index, reduction)``;
    each also receives the method's ``options`` as keywords.

    ``unavailable_reason`` returns None when the method can run here, else a sentence saying why not.
    ``validate`` (optional) rejects an op's main input that the method cannot take (a CPU tensor for
    a GPU method) with a clear error. ``prepare`` (optional) does one-time work such as building an
    extension and returns what it cost. ``exact=False`` marks a timing-only stand-in that does not
    compute what its ops promise (never reported as a speedup). ``approximate=True`` marks a method
    that is approximate by design (its ops are not expected to match float64 within the contract's
    tolerances): the correctness gate skips it and a study judges it by loss parity alone.
    ``peer=True`` marks a public implementation wrapped as shipped, to be measured beside the
    project's methods: the gate and the parity check judge it on every run, but the unit tests do not
    hold it to the contract's corner cases (e.g. fully masked rows, all targets ignored).
    ``options``: option name -> the accepted values, the first being the default (``sdpa``'s
    ``backend``, say); ``options_unavailable(options)`` (optional) says why the method cannot run
    here with those options.
    """

    name: str
    summary: str
    softmax: Optional[Callable[..., torch.Tensor]] = None
    attention: Optional[Callable[..., torch.Tensor]] = None
    attention_qkv: Optional[Callable[..., torch.Tensor]] = None
    cross_entropy: Optional[Callable[..., torch.Tensor]] = None
    linear_cross_entropy: Optional[Callable[..., torch.Tensor]] = None
    unavailable_reason: Callable[[], Optional[str]] = _runs_everywhere
    validate: Optional[Callable[[torch.Tensor], None]] = None
    prepare: Optional[Callable[[], dict]] = None
    exact: bool = True
    peer: bool = False
    approximate: bool = False
    options: Mapping[str, tuple] = field(default_factory=dict)
    options_unavailable: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None

    def __post_init__(self) -> None:
        if not any(getattr(self, op) for op in OPS):
            raise ValueError(f"method {self.name!r} implements no op; it needs at least one of {', '.join(OPS)}")
        if self.attention_qkv is not None and self.attention is None and self.softmax is None:
            raise ValueError(f"method {self.name!r} implements attention_qkv but not attention (nor a softmax to "
                             "compose it from): attention_qkv is attention's variant on the unsplit projection")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def native_ops(self) -> tuple[str, ...]:
        """The ops this method implements itself."""
        return tuple(op for op in OPS if getattr(self, op) is not None)

    def provides(self, op: str) -> Optional[str]:
        """'native' when the method implements ``op``, 'composed' when it can build it from an op it
        implements, None when it can do neither."""
        if getattr(self, op, None) is not None:
            return "native"
        base = COMPOSED_FROM.get(op)
        if base and self.provides(base):
            return "composed"
        return None

    def ops(self) -> dict[str, str]:
        """op -> 'native' | 'composed', for every op this method provides; a variant of an op it provides
        (:data:`VARIANTS`) only where the method implements it (composed, it is that op on views)."""
        return {op: how for op in OPS if (how := self.provides(op)) and (how == "native" or op not in VARIANTS)}


@dataclass(frozen=True)
class Availability:
    name: str
    available: bool
    reason: str  # why it cannot run here ("" when it can)
    summary: str
    exact: bool = True
    ops: Mapping[str, str] = field(default_factory=dict)  # op -> native | composed


_REGISTRY: dict[str, Method] = {}
_LOADED = False
_AVAILABILITY: dict[str, Availability] = {}
_BOUND: dict[tuple, Callable] = {}


def register(method: Method) -> Method:
    """Add a method to the registry (called by each module in ``kernels/methods/`` at import)."""
    if not isinstance(method, Method):
        raise TypeError(f"register() takes a kernels.Method, got {type(method).__name__}")
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise ValueError(f"method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    refresh()
    return method


def unregister(name: str) -> None:
    """Remove a method (tests register throw-away methods and remove them again)."""
    _REGISTRY.pop(name, None)
    refresh()


def refresh() -> None:
    """Forget the cached availability and bound functions (a method that failed to build, a method
    registered later): the next call asks every method again."""
    _AVAILABILITY.clear()
    _BOUND.clear()


def load_methods() -> None:
    """Import every module of ``kernels.methods`` once, so that each registers its method."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import kernels.methods as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def _availability(m: Method) -> Availability:
    a = _AVAILABILITY.get(m.name)
    if a is None:
        reason = m.unavailable_reason() or ""
        a = Availability(m.name, not reason, reason, m.summary, m.exact, MappingProxyType(m.ops()))
        _AVAILABILITY[m.name] = a
    return a


def available_methods(include_timing_only: bool = False, op: Optional[str] = None) -> dict[str, Availability]:
    """Every registered method with whether it can run here and, if not, why (computed once per
    process: :func:`refresh` asks again). ``op``: only the methods that provide that op."""
    load_methods()
    out = {}
    for name, m in _REGISTRY.items():
        if not m.exact and not include_timing_only:
            continue
        if op is not None and not m.provides(op):
            continue
        out[name] = _availability(m)
    return out


def runnable_methods(op: Optional[str] = None, include_timing_only: bool = False) -> list[str]:
    """The methods that can run here (that provide ``op``, when given)."""
    return [n for n, a in available_methods(include_timing_only, op).items() if a.available]


def _runnable_text() -> str:
    names = runnable_methods(include_timing_only=True)
    return ", ".join(names) or "none"


def get_method(name: str) -> Method:
    """Look a method up; unknown or not runnable here raises an error that says why and what can run."""
    load_methods()
    method = _REGISTRY.get(name)
    if method is None:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownMethodError(
            f"unknown method {name!r}; registered methods: {known}; runnable here: {_runnable_text()}"
        )
    a = _availability(method)
    if not a.available:
        raise MethodUnavailableError(
            f"method {name!r} cannot run here: {a.reason}. Methods that can run here: {_runnable_text()}"
        )
    return method


def unavailable_reason(method: str, **options: Any) -> Optional[str]:
    """Why ``method`` with ``options`` cannot run here (None: it can); an unknown method or option
    raises the same errors as :func:`bind`."""
    try:
        m = get_method(method)
    except MethodUnavailableError:
        return _availability(_REGISTRY[method]).reason
    _check_options(m, options, raise_unavailable=False)
    return m.options_unavailable(options) if (m.options_unavailable and options) else None


def _check_options(m: Method, options: dict, raise_unavailable: bool = True) -> dict:
    for key, value in options.items():
        accepted = m.options.get(key)
        if accepted is None:
            have = ", ".join(m.options) or "none"
            raise ValueError(f"method {m.name!r} takes no option {key!r} (its options: {have})")
        if value not in accepted:
            raise ValueError(
                f"method {m.name!r}: option {key}={value!r} is not accepted: one of {', '.join(map(str, accepted))}"
            )
    if raise_unavailable and options and m.options_unavailable is not None:
        reason = m.options_unavailable(options)
        if reason:
            raise MethodUnavailableError(f"method {m.name!r} with {options} cannot run here: {reason}")
    return options


def op_function(m: Method, op: str, options: dict) -> Callable:
    """The unchecked op function of ``m`` (native, or composed from the op it is built from)."""
    how = m.provides(op)
    if how is None:
        raise OpNotImplementedError(
            f"method {m.name!r} does not implement {op} and cannot compose it (it implements: "
            f"{', '.join(m.native_ops())}); methods that provide {op} here: "
            f"{', '.join(runnable_methods(op=op, include_timing_only=True)) or 'none'}"
        )
    fn = _unbound(m, op)
    return (lambda *a: fn(*a, **options)) if options else fn


def _unbound(m: Method, op: str) -> Callable:
    """``m``'s function of ``op`` (which it provides), composed down to the op it implements."""
    return getattr(m, op) if m.provides(op) == "native" else _COMPOSE[op](_unbound(m, COMPOSED_FROM[op]))


def bind(method: str, op: str = "softmax", **options: Any) -> Callable:
    """The checked hot-path function of ``op`` for ``method`` (what a model calls in its loop: the
    registry is consulted once, traceable by torch.compile), with the op's positional signature (see
    :class:`Method`). Cached: the same (method, op, options) returns the same function."""
    key = (method, op, tuple(sorted(options.items())))
    fn = _BOUND.get(key)
    if fn is None:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
        m = get_method(method)
        fn = contract.checked(op, m.name, op_function(m, op, _check_options(m, options)), m.validate)
        _BOUND[key] = fn
    return fn


def softmax(scores: torch.Tensor, *, scale: float = 1.0, causal: bool = False, method: str = "torch",
            **options: Any) -> torch.Tensor:
    """Softmax over the last dimension of ``scale * scores`` with an optional causal mask (see
    :mod:`kernels.contract`)."""
    fn = _BOUND.get((method, "softmax", tuple(sorted(options.items())))) or bind(method, "softmax", **options)
    return fn(scores, scale, causal)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
              causal: bool = True, dropout_p: float = 0.0, method: str = "torch", **options: Any) -> torch.Tensor:
    """softmax(scale * q k^T, causal) v for q (B, H, Tq, d), k and v (B, H, Tk, d); scale None means
    1/sqrt(d) (see :mod:`kernels.contract`)."""
    fn = _BOUND.get((method, "attention", tuple(sorted(options.items())))) or bind(method, "attention", **options)
    return fn(q, k, v, scale, causal, dropout_p)


def attention_qkv(qkv: torch.Tensor, n_head: int, *, scale: Optional[float] = None, causal: bool = True,
                  dropout_p: float = 0.0, method: str = "torch", **options: Any) -> torch.Tensor:
    """The attention of qkv (B, T, 3 n_head d), q, k and v side by side, -> (B, n_head, T, d) (see
    :mod:`kernels.contract`)."""
    key = (method, "attention_qkv", tuple(sorted(options.items())))
    fn = _BOUND.get(key) or bind(method, "attention_qkv", **options)
    return fn(qkv, n_head, scale, causal, dropout_p)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, method: str = "torch", ignore_index: int = -100,
                  reduction: str = "mean", **options: Any) -> torch.Tensor:
    """Cross-entropy of logits (..., V) against integer targets (...) (see :mod:`kernels.contract`)."""
    key = (method, "cross_entropy", tuple(sorted(options.items())))
    fn = _BOUND.get(key) or bind(method, "cross_entropy", **options)
    return fn(logits, targets, ignore_index, reduction)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, method: str = "torch",
                         ignore_index: int = -100, reduction: str = "mean", **options: Any) -> torch.Tensor:
    """The cross-entropy of ``hidden @ weight.T`` without holding all the logits at once where the
    method implements it natively (see :mod:`kernels.contract`)."""
    key = (method, "linear_cross_entropy", tuple(sorted(options.items())))
    fn = _BOUND.get(key) or bind(method, "linear_cross_entropy", **options)
    return fn(hidden, weight, targets, ignore_index, reduction)
