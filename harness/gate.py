"""Correctness gate: every softmax a method patched, checked against float64 on the shapes the run
will see, forward and backward, before any of its numbers are trusted (training start-up and
speedup studies).

What is checked at a run's shapes is each op's entry in the op table (``kernels.ops``: its
``gate_case``); which op, the one the model calls at each seam (harness.accel), or, for an attention
composed from the method's softmax, that softmax (the entry's ``gate_base``):

* attention composed from the method's softmax: the softmax itself on (1, heads, T, T) causal scores
  (fewer heads for long rows, at most GATE_SCORES scores: every row length is still checked, and
  the float64 reference of a T = 16384 run's full scores would not fit beside the model);
* native attention: attention on q (1, heads, T, head dim) and k, v with the run's grouping
  (``RunShapes.kv_heads``: whole groups of query heads); a native attention_qkv, what the model then
  calls, instead: on the run's (1, T, (H + 2 Hkv) d) projection (all heads computed, as many checked,
  the last among them: the same kernels, in the run's layout);
* the loss: the method's cross-entropy on (rows, vocabulary) logits (linear form: on hidden states
  and a head weight of the model's shapes), 256 rows, one target in eight ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch

import kernels
from kernels import ops
from kernels.ops import RunShapes  # (harness.train builds the run's shapes from here)


#: the most scores the softmax check holds at once (with its float64 copies, some 10-15 GiB at 2^28)
GATE_SCORES = 2**28


class GateError(RuntimeError):
    """A patched op failed its correctness check: no training, no numbers."""


@dataclass
class GateResult:
    method: str
    passed: bool
    fwd_error: float
    bwd_error: float
    shape: tuple
    dtype: str
    reason: str = ""
    op: str = "softmax"

    def as_dict(self) -> dict:
        return asdict(self)


def _errors(method: str, op: str, shape: tuple, name: str, got: list, want: list, ftol: float, btol: float) -> GateResult:
    """got/want: [forward output, gradients...] of the method and the float64 reference."""
    fwd = kernels.relative_error(got[0], want[0])
    bwd = max((kernels.relative_error(g, w) for g, w in zip(got[1:], want[1:])), default=0.0)
    reasons = []
    if not fwd <= ftol:  # NaN fails too
        reasons.append(f"forward error {fwd:.2e} > {ftol:.1e}")
    if not bwd <= btol:
        reasons.append(f"backward error {bwd:.2e} > {btol:.1e}")
    return GateResult(method, not reasons, fwd, bwd, tuple(shape), name, "; ".join(reasons), op)


def check_op(method: str, op: str, shapes: RunShapes, heads: Optional[int] = None, seed: int = 0,
             options: Optional[dict] = None) -> GateResult:
    """``method``'s bound ``op`` on its entry's gate case at ``shapes`` (``heads``: how many heads to
    check, default all): the output and the input gradients against float64, each within the case's
    tolerance, and the case's other conditions."""
    case = ops.get(op).gate_case(shapes, shapes.heads if heads is None else heads, seed)
    name = str(case.dtype).replace("torch.", "")
    try:
        out = kernels.bind(method, op, **(options or {}))(*case.args)
        out.backward(case.grad)
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), tuple(case.shape), name,
                          f"raised {type(exc).__name__}: {exc}", op)
    judged = case.judge(out)
    res = _errors(method, op, case.shape, name, judged.got, judged.want, judged.fwd_tol, judged.bwd_tol)
    if judged.reasons:
        res.passed = False
        res.reason = "; ".join(filter(None, [res.reason, *judged.reasons]))
    return res


def check_attention_qkv(method: str, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype, device: str,
                        checked: Optional[int] = None, seed: int = 0, options: Optional[dict] = None,
                        kv_heads: int = 0) -> GateResult:
    """attention_qkv at a run's width (``heads`` of ``head_dim``, ``kv_heads`` key/value heads (0: ``heads``),
    ``seq_len`` tokens), ``checked`` heads (default all; else the first ones and the last) against float64
    (see :func:`check_op`)."""
    shapes = RunShapes(heads=heads, seq_len=seq_len, head_dim=head_dim, vocab=0, n_embd=heads * head_dim, tokens=0,
                       dtype=dtype, device=device, kv_heads=kv_heads)
    return check_op(method, "attention_qkv", shapes, checked, seed, options)


def gated_op(method: str, op: str) -> str:
    """The op the gate checks for ``method``'s ``op``: the op itself, or, where the method composes it and
    the entry says so (``gate_base``), what it is built from (the attention's softmax)."""
    entry = ops.get(op)
    if entry.gate_base and kernels.get_method(method).provides(op) == "composed":
        return gated_op(method, entry.composed_from)
    return op


def _unchecked(m) -> Optional[str]:
    """Why the gate leaves the ops of method ``m`` unchecked (None: it checks them)."""
    if not m.exact:
        return "timing-only method (not what its ops promise)"
    if m.approximate:
        return "approximate by design: judged by loss parity only"
    return None


def run_gate(applied, shapes: RunShapes) -> dict:
    """Check every op ``applied`` (harness.accel.Applied) patched, each against the method it came from
    (the loss from ``applied.loss_from``); returns the record for results.json and raises GateError on
    the first failure."""
    m = kernels.get_method(applied.method)
    lm = kernels.get_method(applied.loss_from) if applied.loss else m
    skip = {"attention": _unchecked(m), "loss": _unchecked(lm) if applied.loss else None}
    heads = max(1, min(shapes.heads, GATE_SCORES // (shapes.seq_len * shapes.seq_len)))  # float64 scores bounded
    results = [check_op(name, gated_op(name, op), shapes, heads, options=options)
               for seam, (name, op, options) in applied.calls().items() if not skip[seam]]
    for r in results:
        if not r.passed:
            raise GateError(
                f"method {r.method!r} failed its {r.op} check against float64 on shape {r.shape} {r.dtype}: "
                f"{r.reason}. Refusing to train (check_kernel=false skips the check, and is recorded in the results)."
            )
    patched = {"attention": applied.attention, "loss": applied.loss}
    whole = getattr(applied, "model_patch", None)  # a library's whole-model patch: its own kernels, as shipped
    if whole:
        skip["model_patch"] = f"{whole['function']} as shipped: judged by loss parity only"
        patched["model_patch"] = whole
    if not results:  # every patched op left unchecked (the first one's reason), or none patched
        why = [skip[op] for op in patched if patched[op] and skip[op]]
        return {"checked": False, "reason": why[0] if why else "nothing patched to check"}
    first = results[0]
    unchecked = {op: why for op, why in skip.items() if why and patched[op]}
    return {"checked": True, **first.as_dict(), "checks": [r.as_dict() for r in results],
            **({"unchecked": unchecked} if unchecked else {})}
