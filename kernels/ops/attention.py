"""``attention(q, k, v, scale, causal, dropout_p)``

q (B, H, Tq, d), k (B, Hkv, Tk, d), v (B, Hkv, Tk, dv) -> (B, H, Tq, dv) in q's dtype, H a multiple of
Hkv: softmax(scale * q k^T) v, query head h reading kv head h // (H / Hkv) (grouped-query attention:
SDPA's ``enable_gqa``, Hugging Face's ``repeat_kv``; Hkv == H is multi-head attention), the gradients
of k and v summed over their group of query heads; a method receives k and v unexpanded (its own
code decides how to serve a group); the causal mask and fully masked rows as in the softmax (a query with no
key gets zeros and zero gradient); scale None means 1/sqrt(d); dropout on the probabilities with
probability ``dropout_p`` (a method that cannot drop out inside its kernel refuses ``dropout_p > 0``
with a clear error); any strides.

Composed from a method's softmax where it has no attention of its own (the materialized rung:
:func:`kernels.compose.attention_from_softmax`); the gate then checks that softmax on the run's scores,
since the float64 reference of a long run's whole attention would not fit beside the model.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from kernels.compose import attention_from_softmax
from kernels.ops.checks import check_dropout, check_float
from kernels.ops.op import GateCase, Judged, Lookup, Op, RunShapes
from kernels.reference import ATTN_BWD_TOL, ATTN_FWD_TOL, reference_attention


def check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> None:
    """The attention's input checks (dtypes, devices, the shape rule of q, k and v, dropout)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(t, name, "attention")
        if t.dim() != 4:
            raise ValueError(f"attention takes q, k, v of shape (B, H, T, d); got {name} of shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention needs q, k, v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention needs q, k, v on one device; got {q.device}, {k.device}, {v.device}")
    (B, H, _, d), (kb, kh, tk, kd), (vb, vh, vt, _) = q.shape, k.shape, v.shape  # (unpacked: no Size slices)
    if not (B == kb == vb and kh == vh and tk == vt and d == kd and kh >= 1 and H % kh == 0):
        raise ValueError(
            f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(q (B, H, Tq, d), k (B, Hkv, Tk, d), v (B, Hkv, Tk, dv), with H a multiple of Hkv >= 1)"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"attention needs a head dimension d >= 1; got q of shape {tuple(q.shape)}")
    check_dropout("attention", dropout_p)


def wrap(fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    def attention(q, k, v, scale: Optional[float] = None, causal: bool = True, dropout_p: float = 0.0):
        check_attention(q, k, v, dropout_p)
        if validate is not None:
            validate(q)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        if q.numel() == 0 or k.shape[-2] == 0 or v.shape[-1] == 0:  # nothing to attend to: zeros
            out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
            return out + (q.sum() + k.sum() + v.sum()) * 0
        return fn(q, k, v, scale, bool(causal), float(dropout_p))

    return attention


def entry(lookup: Lookup) -> Callable:
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
                  causal: bool = True, dropout_p: float = 0.0, method: str = "torch", **options: Any) -> torch.Tensor:
        """softmax(scale * q k^T, causal) v for q (B, H, Tq, d), k and v (B, Hkv, Tk, d), H a multiple of
        Hkv (grouped-query attention: query head h reads kv head h // (H / Hkv)); scale None means
        1/sqrt(d) (see :mod:`kernels.ops.attention`)."""
        return lookup(method, "attention", options)(q, k, v, scale, causal, dropout_p)

    return attention


def gate_case(shapes: RunShapes, heads: int, seed: int = 0) -> GateCase:
    """Causal q (1, heads, T, head dim), k and v with the run's grouping (``heads`` rounded up to whole
    groups of H / Hkv query heads); the output and the three input gradients against float64."""
    groups = shapes.heads // shapes.n_kv_heads
    kv = max(1, -(-heads // groups))
    shape, kv_shape, dtype = (1, kv * groups, shapes.seq_len, shapes.head_dim), (1, kv, shapes.seq_len,
                                                                                shapes.head_dim), shapes.dtype
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(s, generator=g).to(device=shapes.device, dtype=dtype)
                     for s in (shape, kv_shape, kv_shape, shape))
    qkv = [t.requires_grad_(True) for t in (q, k, v)]

    def judge(out: torch.Tensor) -> Judged:
        ref_in = [t.detach().to(torch.float64).requires_grad_(True) for t in qkv]
        ref = reference_attention(*ref_in, causal=True)
        ref.backward(dout.to(torch.float64))
        return Judged([out] + [t.grad for t in qkv], [ref] + [t.grad for t in ref_in], ATTN_FWD_TOL[dtype],
                      ATTN_BWD_TOL[dtype])

    return GateCase(shape, dtype, (*qkv, None, True, 0.0), dout, judge)


OP = Op("attention", "attention(q, k, v, scale, causal, dropout_p)", wrap, entry, reference_attention, gate_case,
        composed_from="softmax", compose=attention_from_softmax, gate_base=True, seam="attention")
