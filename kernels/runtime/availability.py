"""Whether Triton kernels can run here: Triton (and Gluon, its lower-level dialect) importable, a CUDA
GPU or Triton's CPU interpreter; and the check that turns away a tensor they cannot take.

Kernel modules take ``triton``, ``tl``, ``gluon``, ``gl`` and ``gl_async`` from here: each is None
where the import failed, with the reason in ``TRITON_ERROR`` / ``GLUON_ERROR``. Importing this module
registers no method.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl

    TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    TRITON_ERROR = f"triton is not importable ({exc})"

try:  # Gluon: Triton's lower-level dialect (explicit layouts, shared memory, async copies)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_async

    GLUON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - older Triton
    gluon = gl = gl_async = None
    GLUON_ERROR = f"this Triton has no Gluon ({type(exc).__name__}: {exc})"


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: why a Triton method cannot run on a machine without a GPU, and how to run it there anyway
NO_GPU_REASON = ("it needs a CUDA GPU and none was found (or Triton's CPU interpreter, slow, for tests: "
                 "TRITON_INTERPRET=1 in the environment before Python starts, e.g. `TRITON_INTERPRET=1 python ...`)")


def unavailable_reason() -> Optional[str]:
    """Why Triton kernels cannot run here (None: they can)."""
    if TRITON_ERROR:
        return TRITON_ERROR
    if torch.cuda.is_available() or interpreter_enabled():
        return None
    return NO_GPU_REASON


def require_gpu_tensor(x: torch.Tensor, what: str) -> None:
    """Raise, naming ``what`` (e.g. "the triton softmax"), for a tensor the kernels cannot take: one not
    on the GPU, outside Triton's interpreter."""
    if x.device.type != "cuda" and not interpreter_enabled():
        raise ValueError(f"{what} runs on CUDA tensors; got a tensor on {x.device} (TRITON_INTERPRET=1 runs "
                         "Triton's CPU interpreter, for tests)")
