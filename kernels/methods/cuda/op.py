"""The `cuda` method's ops: ``softmax_harness_cuda::softmax_fwd`` / ``softmax_bwd`` (registered in C++
by ``csrc/softmax_binding.cpp``) and the cross-entropy primitives ``ce_rows`` / ``scale_grad_``
(``csrc/cross_entropy_binding.cpp``) get their fake implementations (and the softmax its autograd) here, so
``torch.compile(fullgraph=True)`` traces through them and ``torch.library.opcheck`` passes (the C++
bindings name this module as the one that registers them: ``m.set_python_module``); :func:`prepare`,
which builds the extension (:mod:`.build`) and registers that Python side once; and the Python entry
points, which prepare on first use.

Called eagerly, :func:`cuda_softmax` goes around the op's Python autograd kernel (tens of microseconds
of dispatch): an ``autograd.Function`` calls the ops below the autograd key, and no autograd at all
when no gradient is needed; under torch.compile it calls the op itself. Same kernels either way."""

from __future__ import annotations

import threading

import torch

from kernels.methods.cuda.build import STATE, load

_LOCK = threading.Lock()


def prepare() -> dict:
    """Build (or load the cached build of) the extension and register its ops' Python side; returns
    {'build_s': seconds} of this call."""
    with _LOCK:
        if STATE["loaded"]:
            return {"build_s": 0.0, "cached_in_process": True}
        build_s = load()
        register_python_side()
        STATE["loaded"] = True
        STATE["build_s"] = build_s
        return {"build_s": STATE["build_s"], "cached_in_process": False}


def register_python_side() -> None:
    """Called once by :func:`prepare`, after the extension has loaded."""

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

    # the cross-entropy primitives (csrc/cross_entropy_binding.cpp; used by .cross_entropy)
    @torch.library.register_fake("softmax_harness_cuda::ce_rows")
    def _ce_rows_fake(logits, targets, ignore_index, grad_scale, grad, path=-1):
        return logits.new_empty((logits.shape[0],), dtype=torch.float32)

    @torch.library.register_fake("softmax_harness_cuda::scale_grad_")
    def _scale_grad_fake(grad, g):
        return None


def validate(x: torch.Tensor) -> None:
    if x.device.type != "cuda":
        raise ValueError(f"the cuda method runs on CUDA tensors; got a tensor on {x.device}")


def _fwd_below_autograd(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.softmax_harness_cuda.softmax_fwd(x, scale, causal)


class _EagerSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
        y = _fwd_below_autograd(x, scale, causal)
        ctx.save_for_backward(y)  # only y is saved
        ctx.scale, ctx.causal = scale, causal
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.softmax_harness_cuda.softmax_bwd(y, dy, ctx.scale, ctx.causal), None, None


def cuda_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if not STATE["loaded"]:
        prepare()
    if torch.compiler.is_compiling():
        return torch.ops.softmax_harness_cuda.softmax_fwd(scores, scale, causal)
    if scores.requires_grad and torch.is_grad_enabled():
        return _EagerSoftmax.apply(scores, scale, causal)
    return _fwd_below_autograd(scores, scale, causal)


def code_path(dtype: torch.dtype, backward: bool, cols: int, aligned: bool = True, rows: int = 1) -> str:
    """Which kernel path rows x cols take: 'register', 'hybrid', 'persist', 'cluster-persist', 'cluster',
    'split' or 'stream' (needs the extension; the paths: csrc/softmax/paths.cuh)."""
    if not STATE["loaded"]:
        prepare()
    code = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
    return torch.ops.softmax_harness_cuda.softmax_path(code, backward, rows, cols, aligned)
