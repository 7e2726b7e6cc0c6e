"""The table of ops: one entry (:class:`Op`) per op, in the order they are listed.

Each op is one module here that states its contract (the module docstring) and defines its entry
``OP``: the input checks and the bound wrapper, what it is composed from and how, its float64
reference, the gate's check at a run's shapes, its public entry point ``kernels.<op>(...)``, and which
softmax of a transformer's step it computes. The registry (the ops a :class:`kernels.Method` may
implement, :func:`kernels.bind`, the entry points), the correctness gate and the harness's wiring
read :data:`TABLE` (always through this module, so that a test can put a copy in its place), so
adding an op is one module here plus its kernels.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from kernels.ops import attention, attention_qkv, cross_entropy, linear_cross_entropy, softmax
from kernels.ops.op import GateCase, Judged, Lookup, Op, RunShapes

#: op name -> its entry, in the order ops are listed
TABLE: Mapping[str, Op] = MappingProxyType({m.OP.name: m.OP for m in (
    softmax, attention, attention_qkv, cross_entropy, linear_cross_entropy)})


def names() -> tuple[str, ...]:
    """The ops, in the order they are listed."""
    return tuple(TABLE)


def get(op: str) -> Op:
    """The entry of ``op``; an unknown op raises the error that lists the ops."""
    entry = TABLE.get(op)
    if entry is None:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(TABLE)}")
    return entry


__all__ = ["GateCase", "Judged", "Lookup", "Op", "RunShapes", "TABLE", "get", "names"]
