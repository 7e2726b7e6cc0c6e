"""Acceleration methods behind one contract per op (the op table: :mod:`kernels.ops`).

Public entry points::

    kernels.softmax(scores, *, scale=1.0, causal=False, method="torch")
    kernels.attention(q, k, v, *, scale=None, causal=True, dropout_p=0.0, method="torch")
    kernels.attention_qkv(qkv, n_head, *, scale=None, causal=True, dropout_p=0.0, method="torch")
    kernels.cross_entropy(logits, targets, *, method="torch", ignore_index=-100, reduction="mean")
    kernels.linear_cross_entropy(hidden, weight, targets, *, method="torch", ...)
    kernels.bind(method, op)      # the checked hot-path function of one op (cached)
    kernels.available_methods()   # name -> Availability(available, reason, summary, exact, ops)

The one-shot entry points are the op table's (one per entry of :data:`kernels.ops.TABLE`), so an op
added to the table is ``kernels.<op>`` without a change here.

This package knows nothing of Lightning, Hydra or W&B.
"""

from kernels.ops.checks import REDUCTIONS, SUPPORTED_DTYPES
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
    ENTRY_POINTS,
    OPS,
    Availability,
    Method,
    MethodUnavailableError,
    OpNotImplementedError,
    UnknownMethodError,
    available_methods,
    bind,
    get_method,
    refresh,
    register,
    registered,
    runnable_methods,
    unavailable_reason,
    unregister,
)

globals().update(ENTRY_POINTS)  # kernels.softmax, kernels.attention, ...: one per op of the table

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
    "available_methods",
    "bind",
    "get_method",
    "reference_attention",
    "reference_cross_entropy",
    "reference_softmax",
    "reference_softmax_backward",
    "refresh",
    "register",
    "registered",
    "relative_error",
    "rounding_floor",
    "runnable_methods",
    "tolerance",
    "unavailable_reason",
    "unregister",
    *ENTRY_POINTS,
]
