"""Acceleration methods behind one contract per op (see :mod:`kernels.contract`).

Public entry points::

    kernels.softmax(scores, *, scale=1.0, causal=False, method="torch")
    kernels.attention(q, k, v, *, scale=None, causal=True, dropout_p=0.0, method="torch")
    kernels.attention_qkv(qkv, n_head, *, scale=None, causal=True, dropout_p=0.0, method="torch")
    kernels.cross_entropy(logits, targets, *, method="torch", ignore_index=-100, reduction="mean")
    kernels.linear_cross_entropy(hidden, weight, targets, *, method="torch", ...)
    kernels.bind(method, op)      # the checked hot-path function of one op (cached)
    kernels.available_methods()   # name -> Availability(available, reason, summary, exact, ops)

This package knows nothing of Lightning, Hydra or W&B.
"""

from kernels.contract import REDUCTIONS, SUPPORTED_DTYPES
from kernels.reference import (
    ATTN_BWD_TOL,
    ATTN_FWD_TOL,
    BWD_TOL,
    FWD_TOL,
    reference_attention,
    reference_cross_entropy,
    reference_softmax,
    reference_softmax_backward,
    relative_error,
    rounding_floor,
    tolerance,
)
from kernels.registry import (
    OPS,
    Availability,
    Method,
    MethodUnavailableError,
    OpNotImplementedError,
    UnknownMethodError,
    attention,
    attention_qkv,
    available_methods,
    bind,
    cross_entropy,
    get_method,
    linear_cross_entropy,
    refresh,
    register,
    runnable_methods,
    softmax,
    unavailable_reason,
    unregister,
)

__all__ = [
    "ATTN_BWD_TOL",
    "ATTN_FWD_TOL",
    "BWD_TOL",
    "FWD_TOL",
    "OPS",
    "REDUCTIONS",
    "SUPPORTED_DTYPES",
    "Availability",
    "Method",
    "MethodUnavailableError",
    "OpNotImplementedError",
    "UnknownMethodError",
    "attention",
    "attention_qkv",
    "available_methods",
    "bind",
    "cross_entropy",
    "get_method",
    "linear_cross_entropy",
    "reference_attention",
    "reference_cross_entropy",
    "reference_softmax",
    "reference_softmax_backward",
    "refresh",
    "register",
    "relative_error",
    "rounding_floor",
    "runnable_methods",
    "softmax",
    "tolerance",
    "unavailable_reason",
    "unregister",
]
