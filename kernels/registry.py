"""The registry of acceleration methods, and the bound op functions a training loop calls.

A method is one module in ``kernels/methods/`` that calls :func:`register` at import time with a
:class:`~kernels.method.Method`, plus one file in ``conf/accel/``. Nothing else changes when a method
is added: the modules are discovered by :func:`load_methods`, and studies and benchmarks list every
method that can run here.

A method implements one or more ops of the table (:mod:`kernels.ops`, where each op's contract is
stated). An op it lacks is composed from the ones it has, as the op's entry says: ``attention`` from
its ``softmax`` (q k^T -> softmax -> v), ``attention_qkv`` from its ``attention`` (split the
projection into views), ``linear_cross_entropy`` from its ``cross_entropy`` (linear ->
cross_entropy). :func:`bind` returns the checked hot-path function of one op, cached per (method, op,
options); availability is computed once per process (:func:`refresh` asks again). The public one-shot
entry points (:data:`ENTRY_POINTS`, ``kernels.<op>``) look the bound function up.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import kernels.methods as method_modules
from kernels import ops
from kernels.method import Method

#: The ops a method may implement, in the order they are listed (the op table's).
OPS = ops.names()

__all__ = ["OPS", "Availability", "ENTRY_POINTS", "Method", "MethodUnavailableError",
           "OpNotImplementedError", "UnknownMethodError", "available_methods", "bind", "entry_point", "get_method", "load_methods",
           "op_function", "refresh", "register", "runnable_methods", "unavailable_reason", "unregister"]


class UnknownMethodError(ValueError):
    """Raised for a method name that no module registered."""


class MethodUnavailableError(RuntimeError):
    """Raised for a registered method that cannot run on this machine (the message says why)."""


class OpNotImplementedError(ValueError):
    """Raised for an op a method neither implements nor can compose from the ops it has."""


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
    for info in sorted(pkgutil.iter_modules(method_modules.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{method_modules.__name__}.{info.name}")


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


def registered(name: str) -> Optional[Method]:
    """The method registered as ``name`` whether it can run here or not (None: no such method): what it is,
    not a function to call (:func:`get_method` for that)."""
    load_methods()
    return _REGISTRY.get(name)


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
    if m.provides(op) == "native":
        return m.impls[op]
    entry = ops.get(op)
    return entry.compose(_unbound(m, entry.composed_from))


def bind(method: str, op: str = "softmax", **options: Any) -> Callable:
    """The checked hot-path function of ``op`` for ``method`` (what a model calls in its loop: the
    registry is consulted once, traceable by torch.compile), with the op's positional signature (see
    :class:`Method`). Cached: the same (method, op, options) returns the same function."""
    key = (method, op, tuple(sorted(options.items())))
    fn = _BOUND.get(key)
    if fn is None:
        entry = ops.get(op)
        m = get_method(method)
        fn = entry.wrap(op_function(m, op, _check_options(m, options)), m.validate)
        fn.__name__ = fn.__qualname__ = f"{op}[{m.name}]"
        _BOUND[key] = fn
    return fn


def _lookup(method: str, op: str, options: dict) -> Callable:
    """The bound function of a one-shot call: the cache, else :func:`bind` (which raises the clear errors)."""
    return _BOUND.get((method, op, tuple(sorted(options.items())))) or bind(method, op, **options)


def entry_point(op: str) -> Callable:
    """The public one-shot function of ``op`` (``kernels.softmax(scores, ..., method="triton")`` and so on),
    built from its entry of the op table."""
    return ops.get(op).entry(_lookup)


#: op -> its public one-shot entry point, for every op of the table (``kernels.<op>``)
ENTRY_POINTS: Mapping[str, Callable] = MappingProxyType({op: entry_point(op) for op in ops.TABLE})
