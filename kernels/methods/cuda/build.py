"""Building the `cuda` method's extension: on first use (or ``prepare()``, in :mod:`.op`), with
``torch.utils.cpp_extension.load`` for the GPU at hand (sm_90 on Hopper), cached under
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) and rebuilt only when a source, a
header (see :func:`headers_flag`) or a flag changes; concurrent builds (DDP ranks) wait on a file lock.
The build time is reported by ``prepare()``, never hidden inside a throughput figure. Without a GPU,
nvcc or ninja the method reports itself unavailable with the reason.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Optional

import torch

CSRC = Path(__file__).resolve().parents[3] / "csrc"
SOURCES = [CSRC / "softmax_binding.cpp", CSRC / "softmax_kernels.cu", CSRC / "cross_entropy_binding.cpp",
           CSRC / "cross_entropy_kernels.cu"]
# the headers the kernels are made of (the code paths: csrc/softmax/paths.cuh, csrc/cross_entropy/paths.cuh)
DEVICE_HEADERS = sorted((CSRC / "softmax").glob("*.cuh"))
CE_DEVICE_HEADERS = sorted((CSRC / "cross_entropy").glob("*.cuh"))
HEADERS = [CSRC / "softmax_kernels.h", CSRC / "cross_entropy_kernels.h", *DEVICE_HEADERS, *CE_DEVICE_HEADERS]
#: Link flags of every build here: keep the symbols of static archives inside the extension. A compiler
#: whose driver links libstdc++ statically (the H200 image's /opt/gcc g++ does: the built library needs no
#: libstdc++.so and exported 3397 std:: symbols) otherwise exports a second libstdc++ from the extension;
#: the dynamic linker binds part of the extension's stream calls to the process's libstdc++.so (torch
#: loaded it first) and part to the copy, whose locale facet ids differ, and the first error message that
#: formats an integer crashed (SIGSEGV in std::ostream::_M_insert<long>, docs/perf.md). Hidden, the
#: copy is used whole. No effect when libstdc++ is linked dynamically (no archive to hide).
LDFLAGS = ["-Wl,--exclude-libs,ALL"]
STATE: dict = {"loaded": False, "error": None, "build_s": None}


def _toolchain_problem() -> Optional[str]:
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU and none was found"
    if not all(src.is_file() for src in SOURCES):
        return (f"its CUDA sources are not here ({CSRC} is missing: an installed wheel does not carry csrc/); "
                "install from a checkout of the repository (pip install -e .)")
    if torch.version.cuda is None:
        return "this PyTorch build has no CUDA support"
    # (lazy: torch.utils.cpp_extension imports setuptools, slow; only a machine with a GPU gets here)
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    if CUDA_HOME is None and shutil.which("nvcc") is None:
        return "the CUDA compiler nvcc was not found (install the CUDA toolkit or set CUDA_HOME)"
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja), needed to build the extension"
    return None


def unavailable_reason() -> Optional[str]:
    if STATE["error"]:
        return f"building the CUDA extension failed: {STATE['error']}"
    return _toolchain_problem()


def headers_flag(headers) -> str:
    """A define carrying a hash of the headers: torch's extension loader re-hashes only the sources and
    flags, so a header edit changes the flags and forces a rebuild."""
    digest = hashlib.sha1(b"".join(Path(h).read_bytes() for h in headers)).hexdigest()[:12]
    return f"-DSOFTMAX_HARNESS_HEADERS={digest}"


def load() -> float:
    """Build (or load the cached build of) the extension into this process; returns the seconds it took.
    A failure is kept (``unavailable_reason`` names it from then on) and raised. The ops' Python side
    (fake implementations, autograd) is registered by the caller, ``op.prepare``."""
    problem = _toolchain_problem()
    if problem:
        raise RuntimeError(f"the cuda softmax cannot be built here: {problem}")
    from torch.utils.cpp_extension import load as load_extension  # (lazy: see _toolchain_problem)

    t0 = time.perf_counter()
    try:
        load_extension(
            name="softmax_harness_cuda",
            sources=[str(s) for s in SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-lineinfo", headers_flag(HEADERS)],
            extra_ldflags=LDFLAGS,
            extra_include_paths=[str(CSRC)],
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:
        STATE["error"] = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        raise
    return time.perf_counter() - t0
