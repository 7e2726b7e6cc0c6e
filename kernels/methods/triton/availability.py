"""Whether the ``triton`` method can run here: Triton (and Gluon, for the hybrid and ring paths) importable,
a CUDA GPU or Triton's CPU interpreter; and the check that rejects an input it cannot take.

The kernel modules take ``triton``, ``tl`` (``tile``) and ``gluon``, ``gl``, ``gl_async`` (``gluon``) from
here: each is None where the import failed, with the reason in ``_TRITON_ERROR`` / ``_GLUON_ERROR``.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    _TRITON_ERROR = f"triton is not importable ({exc})"

try:  # Gluon: Triton's lower-level dialect (explicit layouts, shared memory, async copies), for the hybrid and ring paths
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_async

    _GLUON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - older Triton
    gluon = gl = gl_async = None
    _GLUON_ERROR = f"this Triton has no Gluon ({type(exc).__name__}: {exc})"


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: why a Triton method cannot run on a machine without a GPU, and how to run it there anyway
NO_GPU_REASON = ("it needs a CUDA GPU and none was found (or Triton's CPU interpreter, slow, for tests: "
                 "TRITON_INTERPRET=1 in the environment before Python starts, e.g. `TRITON_INTERPRET=1 python ...`)")


def unavailable_reason() -> Optional[str]:
    if _TRITON_ERROR:
        return _TRITON_ERROR
    if torch.cuda.is_available() or interpreter_enabled():
        return None
    return NO_GPU_REASON


def validate(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreter_enabled():
        raise ValueError(
            f"the triton softmax runs on CUDA tensors; got a tensor on {x.device} (TRITON_INTERPRET=1 "
            "runs Triton's CPU interpreter, for tests)"
        )
