"""Prepared launch sites built from a call's own launches, for the plans whose kernels take TMA descriptors
(the Gluon ones), whose arguments the pointer plans' sites (``fwd._site``, ``bwd._site``) cannot bind.

Each launch the first call made is traced back, by identity, to the call's named tensors (q, k, v, out,
lse, do, delta, the gradients, ...): a tensor argument to its name, a descriptor (``gluon_common.descriptor``)
to its tensor's name and its box. A later call with the same site key (which fixes shapes, strides, dtypes,
device, scale, causality and alignment, so the plan, the checks and every descriptor's box and layout) makes
its own tensors, rebuilds each argument from them and calls the prepared launches
(``fastlaunch.PreparedSlots``): no plan lookup, no input checks, no specialization key. A launch whose
arguments cannot all be traced (a tensor not among the named ones, another kind of descriptor, an object
that is neither a tensor nor a number) or prepared leaves the call without a site: the general path then
serves every call, as before.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash import gluon_common
from kernels.runtime import fastlaunch


def recipe(args: tuple, named: dict) -> Optional[tuple]:
    """Where each tensor or descriptor positional of ``args`` comes from, in order: a name of ``named`` (the
    tensor itself) or (name, rows, cols) (``gluon_common.descriptor`` of that tensor with that box); numbers
    are fixed and left out. None where an argument cannot be traced."""
    desc_class = gluon_common.GluonDescriptor
    out = []
    for a in args:
        if a.__class__ is torch.Tensor:
            name = next((n for n, t in named.items() if t is a), None)
            if name is None:
                return None
            out.append(name)
        elif desc_class is not None and a.__class__ is desc_class:
            name = next((n for n, t in named.items() if t is a.base), None)
            box = list(a.block_shape)
            if (name is None or len(box) != 4 or box[:2] != [1, 1] or list(a.shape) != list(a.base.shape)
                    or list(a.strides) != list(a.base.stride())):
                return None
            again = gluon_common.descriptor(a.base, box[2], box[3])  # (what a replay makes: the same in all)
            if again.layout != a.layout or getattr(again, "padding", None) != getattr(a, "padding", None):
                return None
            out.append((name, box[2], box[3]))
        elif a.__class__ not in (int, float, bool):
            return None
    return tuple(out)


def arguments(rec: tuple, ns: dict) -> list:
    """The changing arguments of a prepared launch, rebuilt from this call's tensors ``ns`` by ``rec`` (a
    descriptor made once a call: ``ns`` keeps it under its recipe entry for the call's later launches)."""
    out = []
    for s in rec:
        if s.__class__ is not str and s not in ns:
            ns[s] = gluon_common.descriptor(ns[s[0]], s[1], s[2])
        out.append(ns[s])
    return out


def steps(launches: list, named: dict) -> Optional[list]:
    """(prepared launch, recipe) for each of ``launches`` ((kernel, grid, arguments, meta), in the order they
    ran); None where one cannot be traced or prepared, or where two names hold one tensor (a later call's
    distinct tensors could not be told apart: the same q passed as k, say)."""
    held = [id(t) for t in named.values() if t is not None]
    if len(set(held)) != len(held):
        return None
    out = []
    for one in launches:
        rec = recipe(one[2], named)
        prep = None if rec is None else fastlaunch.prepare(*one)
        if prep is None:
            return None
        out.append((prep, rec))
    return out


def run(prepared: list, ns: dict) -> bool:
    """Launch ``prepared`` (from ``steps``) on this call's tensors; False where the first declined (another
    current device: nothing launched, the caller's general path takes the call)."""
    for i, (prep, rec) in enumerate(prepared):
        if not prep(*arguments(rec, ns)):
            if i == 0:
                return False
            raise RuntimeError("a prepared flash launch found another current device mid-call")
    return True
