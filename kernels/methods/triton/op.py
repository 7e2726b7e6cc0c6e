"""The ``triton`` method as torch ops: ``softmax_harness::triton_softmax_fwd`` / ``_bwd``
(``torch.library.custom_op`` with fake implementations and autograd; only the output is saved for
backward), so ``torch.compile(fullgraph=True)`` traces a model that uses it without a graph break;
:func:`triton_softmax` is the method's softmax."""

from __future__ import annotations

import torch

from kernels.methods.triton.availability import validate
from kernels.methods.triton.launch import launch_bwd, launch_fwd


def _check_op_input(x: torch.Tensor, causal: bool) -> None:
    from kernels.contract import check_scores

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


def triton_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return triton_softmax_fwd(scores, scale, causal)
