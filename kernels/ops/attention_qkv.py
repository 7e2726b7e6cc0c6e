"""``attention_qkv(qkv, n_head, scale, causal, dropout_p[, n_kv_head])``

The attention of one projection's output: qkv (B, T, (n_head + 2 n_kv_head) d) holds q (n_head heads),
k and v (n_kv_head heads each) side by side on its last dimension (``nn.Linear(C, 3 C)``'s layout when
n_kv_head == n_head, :func:`kernels.layouts.split_qkv`) -> (B, n_head, T, d), equal to
``attention(*split_qkv(qkv, n_head, n_kv_head), ...)`` (grouped-query attention when n_kv_head <
n_head, which must divide it); n_kv_head None means n_head; scale None means 1/sqrt(d). A method's
function is called as ``fn(qkv, n_head, scale, causal, dropout_p)`` when n_kv_head == n_head (as before
grouped heads existed), and with n_kv_head as a sixth positional argument when it is smaller: a native
``attention_qkv`` that takes a grouped projection accepts it.
A method that implements it natively returns the gradient of qkv as one tensor (the composed op's
backward concatenates the three gradients: a copy of all of them).

A variant of ``attention``: composed from it on the split views
(:func:`kernels.compose.attention_qkv_from_attention`), listed only where a method implements it.
The gate checks it at the run's projection width, every head computed.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from kernels.compose import attention_qkv_from_attention
from kernels.ops.checks import check_dropout, check_float
from kernels.ops.op import GateCase, Judged, Lookup, Op, RunShapes
from kernels.reference import ATTN_BWD_TOL, ATTN_FWD_TOL, reference_attention
from kernels.layouts import split_qkv


def _heads(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"attention_qkv takes {name}, an int >= 1; got {value!r}")


def check_attention_qkv(qkv: torch.Tensor, n_head: int, dropout_p: float, n_kv_head: Optional[int] = None) -> None:
    """The checks of attention_qkv's inputs (dtype, n_head and n_kv_head, the projection's shape rule,
    dropout)."""
    check_float(qkv, "qkv", "attention_qkv")
    _heads(n_head, "n_head")
    kv = n_head if n_kv_head is None else n_kv_head
    _heads(kv, "n_kv_head")
    if n_head % kv:
        raise ValueError(f"attention_qkv takes n_kv_head dividing n_head; got n_head={n_head}, n_kv_head={kv} "
                         f"(qkv of shape {tuple(qkv.shape)})")
    width = n_head + 2 * kv
    if qkv.dim() != 3 or qkv.shape[-1] == 0 or qkv.shape[-1] % width:
        raise ValueError(
            f"attention_qkv takes qkv of shape (B, T, 3 * n_head * d) with d >= 1 (grouped: (B, T, (n_head + 2 * "
            f"n_kv_head) * d)); got {tuple(qkv.shape)} with n_head={n_head}, n_kv_head={kv} (the last dimension must "
            f"be a positive multiple of {width})"
        )
    check_dropout("attention_qkv", dropout_p)


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def attention_qkv(qkv, n_head: int, scale: Optional[float] = None, causal: bool = True,
                      dropout_p: float = 0.0, n_kv_head: Optional[int] = None):
        check_attention_qkv(qkv, n_head, dropout_p, n_kv_head)
        if validate is not None:
            validate(qkv)
        kv = n_head if n_kv_head is None else n_kv_head
        d = qkv.shape[-1] // (n_head + 2 * kv)
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        if qkv.numel() == 0:  # no batch or no token: zeros
            return qkv.new_zeros((qkv.shape[0], n_head, qkv.shape[1], d)) + qkv.sum() * 0
        if kv == n_head:  # the call of a method written before grouped heads
            return fn(qkv, n_head, scale, bool(causal), float(dropout_p))
        return fn(qkv, n_head, scale, bool(causal), float(dropout_p), kv)

    return attention_qkv


def entry(lookup: Lookup) -> Callable:
    def attention_qkv(qkv: torch.Tensor, n_head: int, *, n_kv_head: Optional[int] = None,
                      scale: Optional[float] = None, causal: bool = True, dropout_p: float = 0.0,
                      method: str = "torch", **options: Any) -> torch.Tensor:
        """The attention of qkv (B, T, (n_head + 2 n_kv_head) d), q, k and v side by side, -> (B, n_head,
        T, d); n_kv_head None means n_head (see :mod:`kernels.ops.attention_qkv`)."""
        return lookup(method, "attention_qkv", options)(qkv, n_head, scale, causal, dropout_p, n_kv_head)

    return attention_qkv


def reference_attention_qkv(qkv: torch.Tensor, n_head: int, *, n_kv_head: Optional[int] = None,
                            scale: Optional[float] = None, causal: bool = True) -> torch.Tensor:
    """The contract in float64 (differentiable): the attention of the split views."""
    return reference_attention(*split_qkv(qkv.to(torch.float64), n_head, n_kv_head), scale=scale, causal=causal)


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """qkv (1, T, (H + 2 Hkv) head_dim), the run's width and layout (H: every head of the run, Hkv its kv
    heads), causal: the output of ``heads`` of them (all, or the first ones and the last) and the gradient
    of their q columns and of their kv heads' k and v columns against float64, each part on its own (the
    output gradient is zero on the other heads, whose gradient columns must then be 0)."""
    H, Hkv, T, d, dtype = shapes.heads, shapes.n_kv_heads, shapes.seq_len, shapes.head_dim, shapes.dtype
    idx = list(range(heads)) if heads >= H else [*range(heads - 1), H - 1]
    others = [h for h in range(H) if h not in idx]
    groups = H // Hkv
    kv_idx = sorted({h // groups for h in idx})
    kv_others = [j for j in range(Hkv) if j not in kv_idx]
    g = torch.Generator().manual_seed(seed)
    shape = (1, T, (H + 2 * Hkv) * d)
    qkv = torch.randn(shape, generator=g).to(device=shapes.device, dtype=dtype).requires_grad_(True)
    dout = torch.zeros((1, H, T, d), dtype=dtype)
    dout[:, idx] = torch.randn((1, len(idx), T, d), generator=g).to(dtype)
    dout = dout.to(shapes.device)

    def judge(out: torch.Tensor) -> Judged:
        # float64 on whole groups: the checked heads' kv heads and every query head they serve
        q_all = [h for j in kv_idx for h in range(j * groups, (j + 1) * groups)]
        q, k, v = split_qkv(qkv, H, Hkv)
        ref_in = [t.detach().to(torch.float64).requires_grad_(True) for t in (q[:, q_all], k[:, kv_idx], v[:, kv_idx])]
        ref = reference_attention(*ref_in, causal=True)
        ref.backward(dout[:, q_all].to(torch.float64))
        dq, dk, dv = split_qkv(qkv.grad, H, Hkv)
        leaks = (others and bool(dq[:, others].count_nonzero())) or (
            kv_others and any(bool(p[:, kv_others].count_nonzero()) for p in (dk, dv)))
        pos = [q_all.index(h) for h in idx]
        return Judged([out[:, idx], dq[:, idx], dk[:, kv_idx], dv[:, kv_idx]],
                      [ref[:, pos], ref_in[0].grad[:, pos], ref_in[1].grad, ref_in[2].grad],
                      ATTN_FWD_TOL[dtype], ATTN_BWD_TOL[dtype],
                      ["nonzero gradient on heads whose output gradient is 0"] if leaks else [])

    return GateCase(shape, dtype, (qkv, H, None, True, 0.0, Hkv if Hkv != H else None), dout, judge)


OP = Op("attention_qkv", "attention_qkv(qkv (B, T, (H + 2 Hkv) d), n_head, scale, causal, dropout_p[, n_kv_head])", wrap, entry,
        reference_attention_qkv, gate_case, composed_from="attention", compose=attention_qkv_from_attention,
        variant="on the unsplit projection", seam="attention")
