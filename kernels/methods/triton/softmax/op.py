"""The ``triton`` softmax as torch ops: ``softmax_harness::triton_softmax_fwd`` / ``_bwd``
(``torch.library.custom_op`` with fake implementations and autograd; only the output is saved for
backward), so ``torch.compile(fullgraph=True)`` traces a model that uses it without a graph break;
:func:`triton_softmax` is the method's softmax.

Two routes to the same launchers: under torch.compile the custom ops (traceable); called eagerly, an
``autograd.Function`` that calls the launchers directly (the custom op's Python dispatch costs tens of
microseconds per call, more than a small kernel runs), entered through the C++ apply where no functorch
transform is active (``Function.apply``'s own Python costs ~2 us), and no autograd at all when no
gradient is needed. The inputs were checked by the bound op (kernels.contract) before either route."""

from __future__ import annotations

import torch

from kernels.contract import check_scores
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.runtime.availability import require_gpu_tensor


def validate(x: torch.Tensor) -> None:
    require_gpu_tensor(x, "the triton softmax")


def _check_op_input(x: torch.Tensor, causal: bool) -> None:
    check_scores(x, causal)
    validate(x)


@torch.library.custom_op("softmax_harness::triton_softmax_fwd", mutates_args=())
def triton_softmax_fwd(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    _check_op_input(x, causal)
    return launch_fwd(x, scale, causal)


@triton_softmax_fwd.register_fake
def _(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("softmax_harness::triton_softmax_bwd", mutates_args=())
def triton_softmax_bwd(y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return launch_bwd(y, dy, scale, causal)


@triton_softmax_bwd.register_fake
def _(y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup_context(ctx, inputs, output) -> None:
    _, scale, causal = inputs
    ctx.save_for_backward(output)  # only y is saved, never the input
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, dy: torch.Tensor):
    (y,) = ctx.saved_tensors
    return triton_softmax_bwd(y, dy, ctx.scale, ctx.causal), None, None


triton_softmax_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerSoftmax(torch.autograd.Function):
    """The eager route: the launchers without the custom op's dispatch (same kernels, same results)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
        y = launch_fwd(x, scale, causal)
        ctx.save_for_backward(y)  # only y is saved, never the input
        ctx.scale, ctx.causal = scale, causal
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return launch_bwd(y, dy, ctx.scale, ctx.causal), None, None


try:  # what Function.apply does when no functorch transform is active, without its Python (~2 us a call):
    # unwrap a dead functorch wrapper (apply does it for every tensor argument), then the C++ apply
    _raw_apply = super(torch.autograd.Function, _EagerSoftmax).apply
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead
    _transforms_active = torch._C._are_functorch_transforms_active
except AttributeError:  # pragma: no cover - another torch: Function.apply itself
    _raw_apply = None


def triton_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return triton_softmax_fwd(scores, scale, causal)
    if scores.requires_grad and torch.is_grad_enabled():
        if _raw_apply is None or _transforms_active():
            return _EagerSoftmax.apply(scores, scale, causal)
        return _raw_apply(_unwrap_if_dead(scores), scale, causal)
    return launch_fwd(scores, scale, causal)
