"""`triton` cross-entropy: the torch ops around the launches of :mod:`.launch` (the algorithm, its code
paths and the bytes they move: the package docstring).

Ops (``torch.library.custom_op``, fake + autograd registrations, so ``torch.compile(fullgraph=True)``
traces them and ``opcheck`` passes): ``softmax_harness::triton_cross_entropy_fwd`` (the kernel: loss
rows, n_valid, gradient; no autograd), ``..._loss`` (the reduction, with autograd: saves the gradient),
``..._bwd`` (the in-place scale) and ``..._grad`` (the gradient recomputed, see below). The gradient
is an input of ``_loss`` rather than an output of an op with autograd because AOTAutograd cannot trace
an op output that its own backward mutates. A second backward through the same graph
(``retain_graph=True``) raises instead of scaling the saved gradient twice.

Eager calls (not compiling) go around the ops (``_EagerCrossEntropy``: the same kernels without three
custom-op dispatches on the host). Under torch.compile the forward computes the loss only and the
backward recomputes the gradient with grad_output folded in (``_grad``: one read of the saved logits, one write): Inductor does not
reinplace a mutation of a saved tensor (a backward-graph input) and would copy the gradient before
scaling it, a full pass on top of the forward's write (4 passes instead of 3). The loss is the same
kernel's; nothing is mutated, so a second compiled backward (where PyTorch allows one) is right too.

Out-of-range targets: CPU tensors are checked before the op (kernels.contract); on a GPU
``_targets_kernel`` (compiled with debug=True) fails a device assert, and the loss row is NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.contract import check_cross_entropy
from kernels.methods.triton.cross_entropy.launch import (
    defers_scale,
    forward,
    recompute_grad,
    reduce_loss,
    scale_grad_,
    validate,
)


# ------------------------------------------------------------------------------------------------
# torch ops
# ------------------------------------------------------------------------------------------------
def _check_op_input(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> None:
    check_cross_entropy(logits, targets, ignore_index, reduction)
    if logits.dim() != 2 or targets.dtype != torch.int64:
        raise ValueError("the triton cross-entropy op takes logits (N, V) and int64 targets (N,)")
    validate(logits)


@torch.library.custom_op("softmax_harness::triton_cross_entropy_fwd", mutates_args=())
def triton_cross_entropy_fwd(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str,
                             compute_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    _check_op_input(logits, targets, ignore_index, reduction)
    return forward(logits, targets, ignore_index, reduction, compute_grad)


@triton_cross_entropy_fwd.register_fake
def _(logits, targets, ignore_index, reduction, compute_grad):
    n, v = logits.shape
    grad = logits.new_empty((n, v)) if compute_grad else logits.new_empty(0)
    return logits.new_empty(n, dtype=torch.float32), logits.new_empty(1, dtype=torch.float32), grad


@torch.library.custom_op("softmax_harness::triton_cross_entropy_loss", mutates_args=())
def triton_cross_entropy_loss(logits: Tensor, targets: Tensor, loss_rows: Tensor, count: Tensor, grad: Tensor,
                              ignore_index: int, reduction: str) -> Tensor:
    """The loss from the forward's rows. Autograd: the forward's gradient scaled in place by
    grad_output, or (``grad`` empty: under torch.compile) the gradient recomputed from the logits."""
    return reduce_loss(loss_rows, count, reduction)


@triton_cross_entropy_loss.register_fake
def _(logits, targets, loss_rows, count, grad, ignore_index, reduction):
    return loss_rows.new_empty(loss_rows.shape if reduction == "none" else ())


@torch.library.custom_op("softmax_harness::triton_cross_entropy_bwd", mutates_args=("grad",))
def triton_cross_entropy_bwd(grad: Tensor, grad_output: Tensor, count: Tensor, divide: bool) -> None:
    """grad *= grad_output (/ n_valid with ``divide``), in place; nothing moves where that is 1."""
    scale_grad_(grad, grad_output, count if divide else None)


@triton_cross_entropy_bwd.register_fake
def _(grad, grad_output, count, divide):
    return None


@torch.library.custom_op("softmax_harness::triton_cross_entropy_grad", mutates_args=())
def triton_cross_entropy_grad(logits: Tensor, targets: Tensor, count: Tensor, grad_output: Tensor,
                              ignore_index: int, reduction: str) -> Tensor:
    """The gradient recomputed from the logits with grad_output folded in (the compiled backward)."""
    return recompute_grad(logits, targets, count, grad_output, ignore_index, reduction)


@triton_cross_entropy_grad.register_fake
def _(logits, targets, count, grad_output, ignore_index, reduction):
    return logits.new_empty(logits.shape)


SECOND_BACKWARD = ("the triton cross-entropy's backward ran a second time through the same graph "
                   "(retain_graph=True): its saved gradient was already scaled in place by the first; "
                   "compute the loss again for each backward")


def _setup_loss(ctx, inputs, output) -> None:
    logits, targets, _, count, grad, ignore_index, reduction = inputs
    ctx.recompute = grad.numel() == 0 and logits.numel() > 0
    ctx.ignore_index, ctx.reduction = ignore_index, reduction
    ctx.divide = reduction == "mean" and defers_scale(logits.dtype)
    ctx.backward_done = False
    if ctx.recompute:
        ctx.save_for_backward(logits, targets, count)
    else:
        ctx.save_for_backward(grad, count)


def _loss_backward(ctx, grad_output: Tensor):
    nones = (None,) * 6
    if ctx.recompute:
        logits, targets, count = ctx.saved_tensors
        return triton_cross_entropy_grad(logits, targets, count, grad_output, ctx.ignore_index, ctx.reduction), *nones
    if ctx.backward_done:
        raise RuntimeError(SECOND_BACKWARD)
    ctx.backward_done = True
    grad, count = ctx.saved_tensors
    triton_cross_entropy_bwd(grad, grad_output, count, ctx.divide)
    return grad, *nones


triton_cross_entropy_loss.register_autograd(_loss_backward, setup_context=_setup_loss)


class _EagerCrossEntropy(torch.autograd.Function):
    """The eager route: the kernels without the custom ops' dispatch (three ops, each a Python dispatch
    on the host; the same kernels and results): the forward writes the gradient, the backward scales it
    in place where grad_output is not 1."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> Tensor:
        rows, count, grad = forward(logits, targets, ignore_index, reduction, True)
        ctx.save_for_backward(grad, count)
        ctx.divide = reduction == "mean" and defers_scale(logits.dtype)
        ctx.backward_done = False
        return reduce_loss(rows, count, reduction)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        if ctx.backward_done:
            raise RuntimeError(SECOND_BACKWARD)
        ctx.backward_done = True
        grad, count = ctx.saved_tensors
        scale_grad_(grad, grad_output, count if ctx.divide else None)
        return grad, None, None, None


def triton_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> Tensor:
    """The method's op function (logits (N, V), int64 targets (N,), already checked). Eager: the
    gradient comes with the forward, through ``_EagerCrossEntropy`` (no custom-op dispatch), or no
    gradient at all. Under torch.compile (the ops): the forward computes the loss only and the backward
    recomputes the gradient (one read and one write), because Inductor copies a saved tensor that the
    backward mutates (a full pass, on top of the forward's write); the loss is the same."""
    if not torch.compiler.is_compiling():
        if logits.dim() != 2 or targets.dtype != torch.int64:  # (the contract's checks ran in kernels)
            raise ValueError("the triton cross-entropy op takes logits (N, V) and int64 targets (N,)")
        validate(logits)
        if logits.requires_grad and torch.is_grad_enabled():
            return _EagerCrossEntropy.apply(logits, targets, ignore_index, reduction)
        rows, count, _ = forward(logits, targets, ignore_index, reduction, False)
        return reduce_loss(rows, count, reduction)
    with torch.no_grad():  # (the same tensor for both ops: a detached alias is materialized twice by Inductor)
        rows, count, grad = triton_cross_entropy_fwd(logits, targets, ignore_index, reduction, False)
    return triton_cross_entropy_loss(logits, targets, rows, count, grad, ignore_index, reduction)
