"""``attention_qkv(qkv, n_head, scale, causal, dropout_p)``

The attention of one projection's output: qkv (B, T, 3 C) holds q, k and v side by side on its last
dimension (``nn.Linear(C, 3 C)``'s layout, :func:`kernels.layouts.split_qkv`), each C = n_head * d split
into heads -> (B, n_head, T, d), equal to ``attention(q, k, v, ...)`` of
``qkv[..., i * C:(i + 1) * C].view(B, T, n_head, d).transpose(1, 2)``; scale None means 1/sqrt(d).
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


def check_attention_qkv(qkv: torch.Tensor, n_head: int, dropout_p: float) -> None:
    """The checks of attention_qkv's inputs (dtype, n_head, the projection's shape rule, dropout)."""
    check_float(qkv, "qkv", "attention_qkv")
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1:
        raise ValueError(f"attention_qkv takes n_head, an int >= 1; got {n_head!r}")
    if qkv.dim() != 3 or qkv.shape[-1] == 0 or qkv.shape[-1] % (3 * n_head):
        raise ValueError(
            f"attention_qkv takes qkv of shape (B, T, 3 * n_head * d) with d >= 1; got {tuple(qkv.shape)} "
            f"with n_head={n_head} (the last dimension must be a positive multiple of {3 * n_head})"
        )
    check_dropout("attention_qkv", dropout_p)


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def attention_qkv(qkv, n_head: int, scale: Optional[float] = None, causal: bool = True,
                      dropout_p: float = 0.0):
        check_attention_qkv(qkv, n_head, dropout_p)
        if validate is not None:
            validate(qkv)
        d = qkv.shape[-1] // (3 * n_head)
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        if qkv.numel() == 0:  # no batch or no token: zeros
            return qkv.new_zeros((qkv.shape[0], n_head, qkv.shape[1], d)) + qkv.sum() * 0
        return fn(qkv, n_head, scale, bool(causal), float(dropout_p))

    return attention_qkv


def entry(lookup: Lookup) -> Callable:
    def attention_qkv(qkv: torch.Tensor, n_head: int, *, scale: Optional[float] = None, causal: bool = True,
                      dropout_p: float = 0.0, method: str = "torch", **options: Any) -> torch.Tensor:
        """The attention of qkv (B, T, 3 n_head d), q, k and v side by side, -> (B, n_head, T, d) (see
        :mod:`kernels.ops.attention_qkv`)."""
        return lookup(method, "attention_qkv", options)(qkv, n_head, scale, causal, dropout_p)

    return attention_qkv


def reference_attention_qkv(qkv: torch.Tensor, n_head: int, *, scale: Optional[float] = None,
                            causal: bool = True) -> torch.Tensor:
    """The contract in float64 (differentiable): the attention of the split views."""
    return reference_attention(*split_qkv(qkv.to(torch.float64), n_head), scale=scale, causal=causal)


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """qkv (1, T, 3 H head_dim), the run's width and layout (H: every head of the run), causal: the output of
    ``heads`` of them (all, or the first ones and the last) and the gradient of their q, k and v columns
    against float64, each part on its own (the output gradient is zero on the other heads, whose gradient
    columns must then be 0)."""
    H, T, d, dtype = shapes.heads, shapes.seq_len, shapes.head_dim, shapes.dtype
    idx = list(range(heads)) if heads >= H else [*range(heads - 1), H - 1]
    others = [h for h in range(H) if h not in idx]
    g = torch.Generator().manual_seed(seed)
    shape = (1, T, 3 * H * d)
    qkv = torch.randn(shape, generator=g).to(device=shapes.device, dtype=dtype).requires_grad_(True)
    dout = torch.zeros((1, H, T, d), dtype=dtype)
    dout[:, idx] = torch.randn((1, len(idx), T, d), generator=g).to(dtype)
    dout = dout.to(shapes.device)

    def judge(out: torch.Tensor) -> Judged:
        ref_in = [t[:, idx].detach().to(torch.float64).requires_grad_(True) for t in split_qkv(qkv, H)]
        ref = reference_attention(*ref_in, causal=True)
        ref.backward(dout[:, idx].to(torch.float64))
        parts = split_qkv(qkv.grad, H)
        leaks = others and any(bool(p[:, others].count_nonzero()) for p in parts)
        return Judged([out[:, idx]] + [p[:, idx] for p in parts], [ref] + [t.grad for t in ref_in],
                      ATTN_FWD_TOL[dtype], ATTN_BWD_TOL[dtype],
                      ["nonzero gradient on heads whose output gradient is 0"] if leaks else [])

    return GateCase(shape, dtype, (qkv, H, None, True, 0.0), dout, judge)


OP = Op("attention_qkv", "attention_qkv(qkv (B, T, 3 H d), n_head, scale, causal, dropout_p)", wrap, entry,
        reference_attention_qkv, gate_case, composed_from="attention", compose=attention_qkv_from_attention,
        variant="on the unsplit projection", seam="attention")
