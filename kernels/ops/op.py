"""The record of one op in the table (:mod:`kernels.ops`), and the gate check an op builds.

An entry holds what follows from the op's contract: the bound wrapper (its input checks, then the
method's function), how it is composed where a method lacks it, its float64 reference, the gate's
check at a training run's shapes, the public one-shot entry point ``kernels.<op>(...)``, and which of
a transformer's two softmaxes it computes. The registry, the public entry points, the correctness gate
and the harness's wiring read these fields instead of naming ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass
class RunShapes:
    """The shapes a training run hands to the patched ops (what an op's gate case samples)."""

    heads: int
    seq_len: int
    head_dim: int
    vocab: int
    n_embd: int
    tokens: int
    dtype: torch.dtype
    device: str
    extra: dict = field(default_factory=dict)
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: ``heads``

    def __post_init__(self) -> None:
        if self.kv_heads and (self.kv_heads < 0 or self.heads % self.kv_heads):
            raise ValueError(f"RunShapes: kv_heads={self.kv_heads} must divide heads={self.heads} (or be 0: heads)")

    @property
    def n_kv_heads(self) -> int:
        """The run's key/value heads (``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads


@dataclass
class Judged:
    """What a gate check compares: the method's [output, input gradients...] and float64's, the accepted
    relative errors, and any other reason it fails."""

    got: list
    want: list
    fwd_tol: float
    bwd_tol: float
    reasons: list = field(default_factory=list)


@dataclass
class GateCase:
    """One float64 check of an op: the bound function's positional arguments (its differentiable inputs
    among them, requiring grad), the gradient of its output (None: a scalar loss), and ``judge(out)``,
    called after the backward. ``shape`` is what the record names."""

    shape: tuple
    dtype: torch.dtype
    args: tuple
    grad: Optional[torch.Tensor]
    judge: Callable[[torch.Tensor], Judged]


#: ``lookup(method, op, options)``: the bound function of ``op`` for ``method`` (the registry's cache)
Lookup = Callable[[str, str, dict], Callable]


@dataclass(frozen=True)
class Op:
    """One op: its contract (the module docstring of ``kernels/ops/<name>.py``) and what follows from it.

    ``signature``: the op function's positional arguments as a method implements them (already checked
    and given the method's options as keywords). ``wrap(fn, validate)``: the bound function, the
    contract's checks (and the method's ``validate`` on the main input) before ``fn``. ``entry(lookup)``:
    the public ``kernels.<name>(..., method=..., **options)``. ``reference``: the contract in float64.
    ``gate_case(shapes, heads, seed)``: a check at a run's shapes (``heads``: how many to check where
    float64 copies of every head would not fit).

    ``composed_from`` and ``compose``: the op it is built from where a method lacks it, and how
    (``compose(base function) -> function``). ``variant``: set (in words: how) where the op is
    ``composed_from`` on other views of its inputs; a method lists it only where it implements it, and
    may implement it only where it provides the base. ``gate_base``: composed, the gate checks the op
    it is built from instead. ``seam``: which softmax of a transformer's step it computes, as
    ``accel.patch`` names them ('attention', 'loss'; empty: only through an op composed from it);
    ``form``: a loss op's input, as ``accel.loss_form`` names it ('logits'; 'linear': the hidden
    states and the head weight).
    """

    name: str
    signature: str
    wrap: Callable[[Callable, Optional[Callable]], Callable]
    entry: Callable[[Lookup], Callable]
    reference: Callable[..., torch.Tensor]
    gate_case: Callable[[RunShapes, int, int], GateCase]
    composed_from: Optional[str] = None
    compose: Optional[Callable[[Callable], Callable]] = None
    variant: str = ""
    gate_base: bool = False
    seam: str = ""
    form: str = ""
