"""Correctness gate: every softmax a method patched, checked against float64 on the shapes the run
will see, forward and backward, before any of its numbers are trusted (training start-up and
speedup studies).

* attention composed from the method's softmax: the softmax itself on (1, heads, T, T) causal scores
  (fewer heads for long rows, at most GATE_SCORES scores: every row length is still checked, and
  the float64 reference of a T = 16384 run's full scores would not fit beside the model);
* native attention: attention on (1, heads, T, head dim); a native attention_qkv, what the model then
  calls, instead: on the run's (1, T, 3 C) projection (all heads computed, as many checked, the last
  among them: the same kernels, in the run's layout);
* the loss: the method's cross-entropy on (rows, vocabulary) logits (linear form: on hidden states
  and a head weight of the model's shapes), 256 rows, one target in eight ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

import kernels
from kernels.contract import split_qkv


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


def check_softmax(
    method: str, shape: tuple, dtype: torch.dtype, device: str, scale: float, causal: bool = True, seed: int = 0
) -> GateResult:
    """Fresh random scores of ``shape``; relative errors of the method's output and input gradient
    against the float64 reference, each within the dtype's tolerance (or 3x the error of merely
    rounding the exact result to the dtype, whichever is larger)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(device=device, dtype=dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    name = str(dtype).replace("torch.", "")
    try:
        y = kernels.softmax(x, scale=scale, causal=causal, method=method)
        y.backward(dy)
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), tuple(shape), name,
                          f"raised {type(exc).__name__}: {exc}")
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    ref = kernels.reference_softmax(x64, scale=scale, causal=causal)
    ref.backward(dy.to(torch.float64))
    res = _errors(method, "softmax", shape, name, [y, x.grad], [ref, x64.grad],
                  kernels.tolerance("fwd", dtype, ref.detach()), kernels.tolerance("bwd", dtype, x64.grad))
    if y.shape != x.shape or y.dtype != x.dtype:
        res.passed = False
        res.reason = "; ".join(filter(None, [res.reason, f"output {tuple(y.shape)} {y.dtype} differs from input "
                                                         f"{tuple(x.shape)} {x.dtype}"]))
    return res


def check_attention(method: str, shape: tuple, dtype: torch.dtype, device: str, causal: bool = True,
                    seed: int = 0, options: Optional[dict] = None) -> GateResult:
    """q, k, v of ``shape`` (B, H, T, d); the output and the three input gradients against float64."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(4))
    name = str(dtype).replace("torch.", "")
    qkv = [t.requires_grad_(True) for t in (q, k, v)]
    try:
        out = kernels.attention(*qkv, causal=causal, method=method, **(options or {}))
        out.backward(dout)
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), tuple(shape), name,
                          f"raised {type(exc).__name__}: {exc}", "attention")
    ref_in = [t.detach().to(torch.float64).requires_grad_(True) for t in qkv]
    ref = kernels.reference_attention(*ref_in, causal=causal)
    ref.backward(dout.to(torch.float64))
    return _errors(method, "attention", shape, name, [out] + [t.grad for t in qkv], [ref] + [t.grad for t in ref_in],
                   kernels.ATTN_FWD_TOL[dtype], kernels.ATTN_BWD_TOL[dtype])


def check_attention_qkv(method: str, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype, device: str,
                        checked: Optional[int] = None, seed: int = 0, options: Optional[dict] = None) -> GateResult:
    """qkv (1, seq_len, 3 heads head_dim), the run's width and layout, causal: the output of ``checked``
    heads (default all; else the first ones and the last) and the gradient of their q, k and v columns
    against float64, each part on its own (the output gradient is zero on the other heads, whose gradient
    columns must then be 0)."""
    checked = heads if checked is None else checked
    idx = list(range(checked)) if checked >= heads else [*range(checked - 1), heads - 1]
    others = [h for h in range(heads) if h not in idx]
    g = torch.Generator().manual_seed(seed)
    shape = (1, seq_len, 3 * heads * head_dim)
    qkv = torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
    dout = torch.zeros((1, heads, seq_len, head_dim), dtype=dtype)
    dout[:, idx] = torch.randn((1, len(idx), seq_len, head_dim), generator=g).to(dtype)
    dout = dout.to(device)
    name = str(dtype).replace("torch.", "")
    try:
        out = kernels.attention_qkv(qkv, heads, method=method, **(options or {}))
        out.backward(dout)
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), shape, name,
                          f"raised {type(exc).__name__}: {exc}", "attention_qkv")
    ref_in = [t[:, idx].detach().to(torch.float64).requires_grad_(True) for t in split_qkv(qkv, heads)]
    ref = kernels.reference_attention(*ref_in, causal=True)
    ref.backward(dout[:, idx].to(torch.float64))
    parts = split_qkv(qkv.grad, heads)
    res = _errors(method, "attention_qkv", shape, name, [out[:, idx]] + [p[:, idx] for p in parts],
                  [ref] + [t.grad for t in ref_in], kernels.ATTN_FWD_TOL[dtype], kernels.ATTN_BWD_TOL[dtype])
    if others and any(bool(p[:, others].count_nonzero()) for p in parts):
        res.passed = False
        res.reason = "; ".join(filter(None, [res.reason, "nonzero gradient on heads whose output gradient is 0"]))
    return res


def check_loss(method: str, op: str, rows: int, vocab: int, n_embd: int, dtype: torch.dtype, device: str,
               seed: int = 0) -> GateResult:
    """The method's cross-entropy (``op``: cross_entropy on (rows, vocab) logits, or linear_cross_entropy
    on (rows, n_embd) hidden states and a (vocab, n_embd) weight), mean over targets of which one in
    eight is ignored: the loss and the input gradients against float64."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[::8] = -100
    t = t.to(device)
    name = str(dtype).replace("torch.", "")
    if op == "cross_entropy":
        inputs = [(torch.randn(rows, vocab, generator=g) * 2).to(device=device, dtype=dtype)]
        shape = (rows, vocab)
    else:
        inputs = [torch.randn(rows, n_embd, generator=g).to(device=device, dtype=dtype),
                  (torch.randn(vocab, n_embd, generator=g) * 0.05).to(device=device, dtype=dtype)]
        shape = (rows, n_embd, vocab)
    inputs = [x.requires_grad_(True) for x in inputs]
    try:
        fn = kernels.cross_entropy if op == "cross_entropy" else kernels.linear_cross_entropy
        loss = fn(*inputs, t, method=method)
        loss.backward()
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), shape, name,
                          f"raised {type(exc).__name__}: {exc}", op)
    ref_in = [x.detach().to(torch.float64).requires_grad_(True) for x in inputs]
    logits = ref_in[0] if op == "cross_entropy" else ref_in[0] @ ref_in[1].T
    ref = kernels.reference_cross_entropy(logits, t)
    ref.backward()
    return _errors(method, op, shape, name, [loss.float()] + [x.grad for x in inputs], [ref] + [x.grad for x in ref_in],
                   2 * kernels.FWD_TOL[dtype], kernels.BWD_TOL[dtype])


@dataclass
class RunShapes:
    """The shapes a training run hands to the patched ops."""

    heads: int
    seq_len: int
    head_dim: int
    vocab: int
    n_embd: int
    tokens: int
    dtype: torch.dtype
    device: str
    extra: dict = field(default_factory=dict)


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
    results = []
    heads = max(1, min(shapes.heads, GATE_SCORES // (shapes.seq_len * shapes.seq_len)))  # float64 scores bounded
    if skip["attention"]:
        pass
    elif applied.attention == "composed":  # the method's own softmax, on the run's scores
        results.append(check_softmax(applied.method, (1, heads, shapes.seq_len, shapes.seq_len), shapes.dtype,
                                     shapes.device, scale=shapes.head_dim ** -0.5, causal=True))
    elif applied.attention_qkv:  # the op the model calls (the run's width: every head computed, ``heads`` checked)
        results.append(check_attention_qkv(applied.method, shapes.heads, shapes.seq_len, shapes.head_dim,
                                           shapes.dtype, shapes.device, checked=heads, options=applied.options))
    elif applied.attention == "native":
        results.append(check_attention(applied.method, (1, heads, shapes.seq_len, shapes.head_dim),
                                       shapes.dtype, shapes.device, options=applied.options))
    if applied.loss and not skip["loss"]:
        op = "cross_entropy" if applied.loss_form == "logits" else "linear_cross_entropy"
        results.append(check_loss(applied.loss_from, op, min(shapes.tokens, 256), shapes.vocab, shapes.n_embd,
                                  shapes.dtype, shapes.device))
    for r in results:
        if not r.passed:
            raise GateError(
                f"method {r.method!r} failed its {r.op} check against float64 on shape {r.shape} {r.dtype}: "
                f"{r.reason}. Refusing to train (check_kernel=false skips the check, and is recorded in the results)."
            )
    patched = {"attention": applied.attention, "loss": applied.loss}
    if not results:  # every patched op left unchecked (the first one's reason), or none patched
        why = [skip[op] for op in ("attention", "loss") if patched[op] and skip[op]]
        return {"checked": False, "reason": why[0] if why else "nothing patched to check"}
    first = results[0]
    unchecked = {op: why for op, why in skip.items() if why and patched[op]}
    return {"checked": True, **first.as_dict(), "checks": [r.as_dict() for r in results],
            **({"unchecked": unchecked} if unchecked else {})}
