"""Softmax implementations behind one contract (see :mod:`kernels.registry`).

Public entry points::

    kernels.softmax(scores, *, scale=1.0, causal=False, method="torch")
    kernels.available_methods()   # name -> Availability(available, reason, summary)

This package knows nothing of Lightning, Hydra or W&B.
"""

from kernels.reference import (
    BWD_TOL,
    FWD_TOL,
    reference_softmax,
    reference_softmax_backward,
    relative_error,
    rounding_floor,
    tolerance,
)
from kernels.registry import (
    SUPPORTED_DTYPES,
    Availability,
    MethodUnavailableError,
    SoftmaxMethod,
    UnknownMethodError,
    available_methods,
    bind,
    get_method,
    register,
    runnable_methods,
    softmax,
    unregister,
)

__all__ = [
    "BWD_TOL",
    "FWD_TOL",
    "rounding_floor",
    "tolerance",
    "SUPPORTED_DTYPES",
    "Availability",
    "MethodUnavailableError",
    "SoftmaxMethod",
    "UnknownMethodError",
    "available_methods",
    "bind",
    "get_method",
    "reference_softmax",
    "reference_softmax_backward",
    "register",
    "relative_error",
    "runnable_methods",
    "softmax",
    "unregister",
]
