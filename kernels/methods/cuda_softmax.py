"""`cuda`: fused scale + causal mask + softmax as a CUDA C++ extension, forward and backward.

The kernels (``csrc/softmax/*.cuh``, paths listed in ``csrc/softmax/paths.cuh``; launched from
``csrc/softmax_kernels.cu`` by a launch table
measured with ``python -m harness.bench cuda-sweep``; no torch header) pick a code path by row length:
rows kept in registers with 16-byte vector loads (several rows per warp for short rows, a block per
row up to 32768 16-bit (kept packed past 16384) / 16384 fp32 columns forward and 8192 16-bit / 4096
fp32 columns backward), a hybrid path for 16-bit forward rows of up to 65536 columns (a block per
row, half of it in registers and the rest in shared memory, two blocks per SM), a persistent path for
the next lengths otherwise (a block per SM loops over rows, prefetching the next row into shared
memory with cp.async while it reduces this one; backward rows up to 32 KB, fp32 forward rows up to
32768 columns over a two-CTA thread-block cluster exchanging one partial per row through distributed
shared memory), a cluster path for long backward
rows (a row over up to 8 CTAs holding 32 KB each in registers), a split path for longer rows (a row
over up to 128 blocks that combine their partials through a workspace in global memory, allocated per
call by the binding), and a streaming path for rows of any length or alignment; causal rows load only
their unmasked prefix. Forward paths other than streaming need a normal, finite scale (any other
takes the streaming path).
``csrc/softmax_binding.cpp`` registers the ops
``softmax_harness_cuda::softmax_fwd`` / ``softmax_bwd`` with ``TORCH_LIBRARY`` (CUDA implementation via
``TORCH_LIBRARY_IMPL``); this module registers their fake implementations and autograd, so
``torch.compile(fullgraph=True)`` traces through them and ``torch.library.opcheck`` passes.

Build: on first use (or ``prepare()``), with ``torch.utils.cpp_extension.load`` for the GPU at hand
(sm_90 on Hopper), cached under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) and
rebuilt only when a source or flag changes; concurrent builds (DDP ranks) wait on a file lock. The build
time is reported by ``prepare()``, never hidden inside a throughput figure. Without a GPU, nvcc or ninja
the method reports itself unavailable with the reason.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from kernels.registry import Method, register

CSRC = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = [CSRC / "softmax_binding.cpp", CSRC / "softmax_kernels.cu"]
# every header the sources include (the kernels: csrc/softmax/*.cuh), hashed into the flags (headers_flag)
HEADERS = [CSRC / "softmax_kernels.h", *sorted((CSRC / "softmax").glob("*.cuh"))]
_LOCK = threading.Lock()
_STATE: dict = {"loaded": False, "error": None, "build_s": None}


def _toolchain_problem() -> Optional[str]:
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU and none was found"
    if torch.version.cuda is None:
        return "this PyTorch build has no CUDA support"
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    if CUDA_HOME is None and shutil.which("nvcc") is None:
        return "the CUDA compiler nvcc was not found (install the CUDA toolkit or set CUDA_HOME)"
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja), needed to build the extension"
    return None


def unavailable_reason() -> Optional[str]:
    if _STATE["error"]:
        return f"building the CUDA extension failed: {_STATE['error']}"
    return _toolchain_problem()


def headers_flag(headers) -> str:
    """A define carrying a hash of the headers: torch's extension loader re-hashes only the sources and
    flags, so a header edit changes the flags and forces a rebuild."""
    import hashlib

    digest = hashlib.sha1(b"".join(Path(h).read_bytes() for h in headers)).hexdigest()[:12]
    return f"-DSOFTMAX_HARNESS_HEADERS={digest}"


def prepare() -> dict:
    """Build (or load the cached build of) the extension; returns {'build_s': seconds} of this call."""
    with _LOCK:
        if _STATE["loaded"]:
            return {"build_s": 0.0, "cached_in_process": True}
        problem = _toolchain_problem()
        if problem:
            raise RuntimeError(f"the cuda softmax cannot be built here: {problem}")
        from torch.utils.cpp_extension import load

        t0 = time.perf_counter()
        try:
            load(
                name="softmax_harness_cuda",
                sources=[str(s) for s in SOURCES],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "-lineinfo", headers_flag(HEADERS)],
                extra_include_paths=[str(CSRC)],
                is_python_module=False,
                verbose=False,
            )
        except Exception as exc:
            _STATE["error"] = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise
        _register_python_side()
        _STATE["loaded"] = True
        _STATE["build_s"] = time.perf_counter() - t0
        return {"build_s": _STATE["build_s"], "cached_in_process": False}


def _register_python_side() -> None:
    @torch.library.register_fake("softmax_harness_cuda::softmax_fwd")
    def _fwd_fake(x, scale, causal):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    @torch.library.register_fake("softmax_harness_cuda::softmax_bwd")
    def _bwd_fake(y, dy, scale, causal):
        return torch.empty(y.shape, dtype=y.dtype, device=y.device)

    def setup_context(ctx, inputs, output):
        _, scale, causal = inputs
        ctx.save_for_backward(output)  # only y is saved
        ctx.scale, ctx.causal = scale, causal

    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return torch.ops.softmax_harness_cuda.softmax_bwd(y, dy, ctx.scale, ctx.causal), None, None

    torch.library.register_autograd("softmax_harness_cuda::softmax_fwd", backward, setup_context=setup_context)


def validate(x: torch.Tensor) -> None:
    if x.device.type != "cuda":
        raise ValueError(f"the cuda softmax runs on CUDA tensors; got a tensor on {x.device}")


def cuda_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if not _STATE["loaded"]:
        prepare()
    return torch.ops.softmax_harness_cuda.softmax_fwd(scores, scale, causal)


def code_path(dtype: torch.dtype, backward: bool, cols: int, aligned: bool = True, rows: int = 1) -> str:
    """Which kernel path rows x cols take: 'register', 'hybrid', 'persist', 'cluster-persist', 'cluster',
    'split' or 'stream' (needs the extension)."""
    if not _STATE["loaded"]:
        prepare()
    code = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
    return torch.ops.softmax_harness_cuda.softmax_path(code, backward, rows, cols, aligned)


register(
    Method(
        name="cuda",
        softmax=cuda_softmax,
        summary="fused CUDA C++ extension: scale + causal mask + softmax, forward and backward, any N",
        unavailable_reason=unavailable_reason,
        validate=validate,
        prepare=prepare,
    )
)
