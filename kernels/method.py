"""What an acceleration method is: :class:`Method`, the ops it implements and what it can compose.

The ops a method may implement are the entries of the op table (:mod:`kernels.ops`); a method passes
each as a keyword, checked against the table, and reads it back as an attribute (``method.softmax``,
None where it has none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import torch

from kernels import ops


def _runs_everywhere() -> Optional[str]:
    return None


@dataclass(frozen=True, init=False)
class Method:
    """One registered acceleration method.

    Op functions are given as keywords named after the ops of the table (:mod:`kernels.ops`), e.g.
    ``Method(name="x", summary="...", softmax=fn, cross_entropy=fn)``. They take their arguments
    positionally, already checked against the op's contract (each op's ``signature``):
    ``softmax(scores, scale, causal)``, ``attention(q, k, v, scale, causal, dropout_p)``,
    ``attention_qkv(qkv (B, T, 3 H d), n_head, scale, causal, dropout_p)``,
    ``cross_entropy(logits (N, V), targets (N,), ignore_index, reduction)``,
    ``linear_cross_entropy(hidden (N, C), weight (V, C), targets (N,), ignore_index, reduction)``;
    each also receives the method's ``options`` as keywords. ``impls`` holds them (op -> function).

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
    here with those options. ``keeps_scores(options, cuda=, float32=, grouped=, dropout=)`` (optional):
    whether the method's native attention keeps T x T scores for its backward in such a run (a fused
    attention that falls back to an unfused path: SDPA's math backend); without it a native attention
    keeps none, one composed from a softmax always does.
    """

    name: str
    summary: str
    impls: Mapping[str, Callable[..., torch.Tensor]]
    unavailable_reason: Callable[[], Optional[str]] = _runs_everywhere
    validate: Optional[Callable[[torch.Tensor], None]] = None
    prepare: Optional[Callable[[], dict]] = None
    exact: bool = True
    peer: bool = False
    approximate: bool = False
    options: Mapping[str, tuple] = field(default_factory=dict)
    options_unavailable: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None
    keeps_scores: Optional[Callable[..., bool]] = None

    def __init__(self, name: str, summary: str, *,
                 unavailable_reason: Callable[[], Optional[str]] = _runs_everywhere,
                 validate: Optional[Callable[[torch.Tensor], None]] = None,
                 prepare: Optional[Callable[[], dict]] = None,
                 exact: bool = True, peer: bool = False, approximate: bool = False,
                 options: Optional[Mapping[str, tuple]] = None,
                 options_unavailable: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None,
                 keeps_scores: Optional[Callable[..., bool]] = None,
                 **impls: Optional[Callable[..., torch.Tensor]]) -> None:
        unknown = [k for k in impls if k not in ops.TABLE]
        if unknown:
            raise TypeError(f"Method() got an unexpected keyword argument {unknown[0]!r} "
                            f"(ops: {', '.join(ops.names())})")
        impls = {op: fn for op, fn in impls.items() if fn is not None}
        given = dict(name=name, summary=summary, impls=MappingProxyType(impls),
                     unavailable_reason=unavailable_reason, validate=validate, prepare=prepare, exact=exact,
                     peer=peer, approximate=approximate, options=MappingProxyType(dict(options or {})),
                     options_unavailable=options_unavailable, keeps_scores=keeps_scores)
        for key, value in given.items():
            object.__setattr__(self, key, value)
        if not self.impls:
            raise ValueError(f"method {name!r} implements no op; it needs at least one of {', '.join(ops.names())}")
        for op in self.impls:
            entry = ops.get(op)
            if entry.variant and not self.provides(entry.composed_from):
                base = ops.get(entry.composed_from)
                nor = f" (nor a {base.composed_from} to compose it from)" if base.composed_from else ""
                raise ValueError(f"method {name!r} implements {op} but not {base.name}{nor}: {op} is {base.name}'s "
                                 f"variant {entry.variant}")

    def __getattr__(self, op: str) -> Optional[Callable[..., torch.Tensor]]:
        """``method.softmax``: the function of an op of the table, None where the method has none."""
        if op != "impls" and op in ops.TABLE:
            return self.impls.get(op)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {op!r}")

    def native_ops(self) -> tuple[str, ...]:
        """The ops this method implements itself."""
        return tuple(op for op in ops.TABLE if op in self.impls)

    def provides(self, op: str) -> Optional[str]:
        """'native' when the method implements ``op``, 'composed' when it can build it from an op it
        implements, None when it can do neither."""
        if op in self.impls:
            return "native"
        entry = ops.TABLE.get(op)
        if entry is not None and entry.composed_from and self.provides(entry.composed_from):
            return "composed"
        return None

    def ops(self) -> dict[str, str]:
        """op -> 'native' | 'composed', for every op this method provides; a variant of an op it provides
        only where the method implements it (composed, it is that op on views)."""
        return {op: how for op, e in ops.TABLE.items()
                if (how := self.provides(op)) and (how == "native" or not e.variant)}
