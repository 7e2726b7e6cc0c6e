"""Fused cross-entropy drivers, method-agnostic: ``cross_entropy`` and the chunked ``linear_cross_entropy``
(the loss of ``hidden @ weight.T`` without ever holding all the logits), built from two primitives a
method supplies. (The `cuda` method's: kernels/methods/cuda/cross_entropy.py; any method with the same two
primitives can use these drivers as they are.)

Primitives:

``ce_rows(logits (n, V), targets (n,) int64, ignore_index, grad_scale, grad) -> losses (n,) float32``
    per row logsumexp - logit[target] (0 where the target is ignore_index); with ``grad`` (an (n, V)
    buffer in the logits' dtype, possibly the logits themselves) also ``(softmax - onehot) * scale``
    written into it (0 on ignored rows); ``grad_scale`` None (1), a one-element float32 device tensor or
    (n,) float32.
``scale_grad_(grad, g)``
    ``grad *= g`` in place, ``g`` a one-element float32 device tensor or one value per row; free (a
    launch, no pass) when ``g`` is exactly 1.

``cross_entropy`` (:func:`make_cross_entropy`): the forward op counts the targets that are not
ignore_index on the device, computes the per-row losses and, when the logits require grad, the gradient
into a new buffer in the logits' dtype (scaled by 1 / n_valid for ``mean``, 1 for ``sum`` and ``none``),
and reduces on the device (``mean`` of no target: 0, never NaN). The backward scales the saved gradient in
place by grad_output (one value per row for ``none``) and returns it: when the loss is the last op
(grad_output = 1) the backward is a launch that does nothing. No host-device sync.

``linear_cross_entropy`` (:func:`make_linear_cross_entropy`): the chunk loop every chunking method
shares (:mod:`kernels.linear_ce`: per chunk of ``chunk_rows`` tokens, ``logits_c = hidden_c @ weight.T``,
``ce_rows`` writes the gradient in place of ``logits_c``, then ``grad_hidden_c = grad_c @ weight`` and
``grad_weight += grad_c.T @ hidden_c``) with this driver's float32 sums (one buffer over all chunks, cast
to the weight's dtype at the end; where cuBLAS cannot add into them, each chunk's product in float32, then
an add). ``mean`` / ``sum``: everything in the forward (a mean's 1 / n_valid in ``ce_rows``, except for
fp16, whose logit gradients would underflow: there it scales the two small gradients), the backward only
scales the two gradients by grad_output. ``none``: the forward computes the losses only, the backward
runs the chunks again with the per-row grad_output as the gradient scale. Extra memory: one chunk of
logits (:func:`kernels.linear_ce.chunk_rows`: at most 350 MiB of them, in chunks of one size), the
float32 weight gradient and the hidden gradient; at 16384 x 768 hidden, 50304 x 768 weight, bf16: 5
chunks of 3280 rows, about 0.47 GiB in all (with the fp32-output GEMM of torch >= 2.8; before it each
chunk's fp32 (V, C) product comes on top). Under ``torch.autocast`` hidden and weight are cast to the
autocast dtype before the op (the casts' backward carries the gradients back to the inputs' dtypes).

Each ``make_*`` registers its forward (and backward) as ``torch.library.custom_op``s
(``softmax_harness::{name}_fwd`` ...) with fake implementations, so ``torch.compile(fullgraph=True)``
traces the returned function and ``torch.library.opcheck`` checks the ops (``fn.ops``); call it once, at
import. :func:`chunked_linear_cross_entropy` is the one-off form (the ops made on the first call per pair
of primitives).

A second backward through the same graph (``retain_graph=True``) of a loss whose gradient the forward
computed raises a RuntimeError saying so: the first backward scaled the saved gradient in place and
handed it on. (Under ``torch.compile`` the saved gradients are donated buffers, for which torch itself
refuses ``retain_graph``.) ``linear_cross_entropy`` with ``none`` recomputes, so it can go twice.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from kernels import linear_ce

CeRows = Callable[..., torch.Tensor]
ScaleGrad = Callable[[torch.Tensor, torch.Tensor], None]

# float32 accumulation of a 16-bit product into an existing float32 buffer: cuBLAS with C = the buffer
# (aten::baddbmm.dtype_out, torch >= 2.8, writes beta * out + a @ b into `out`), checked once on the
# device; else the product in float32 then an add (one more pass over the weight gradient per chunk).
_ACCUMULATE: dict = {"mode": None}


def _probe_accumulate(device: torch.device) -> str:
    try:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(24, 40, device=device, generator=g).to(torch.bfloat16).t()  # transposed, as grad_c.T
        b = torch.randn(24, 32, device=device, generator=g).to(torch.bfloat16)
        acc = torch.randn(40, 32, device=device, generator=g)
        want = acc + a.float() @ b.float()
        out = acc.unsqueeze(0)
        torch.ops.aten.baddbmm.dtype_out(out, a.unsqueeze(0), b.unsqueeze(0), torch.float32, out=out)
        ok = bool(torch.allclose(acc, want, atol=1e-3, rtol=1e-3))  # (the one host sync, once per process)
    except (RuntimeError, AttributeError, TypeError):
        ok = False
    return "baddbmm" if ok else "add"


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.float32:
        return torch.mm(a, b)
    if a.device.type != "cuda":  # (aten::mm.dtype is CUDA only)
        return torch.mm(a.float(), b.float())
    return torch.ops.aten.mm.dtype(a, b, torch.float32)


def _accumulate(acc: Optional[torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b in float32 (acc None: a new buffer)."""
    if acc is None:
        return _mm_f32(a, b)
    if a.dtype == torch.float32:
        return acc.addmm_(a, b)
    mode = _ACCUMULATE["mode"] if a.device.type == "cuda" else "add"
    if mode is None:
        mode = _ACCUMULATE["mode"] = _probe_accumulate(a.device)
    if mode == "baddbmm":
        out = acc.unsqueeze(0)
        torch.ops.aten.baddbmm.dtype_out(out, a.unsqueeze(0), b.unsqueeze(0), torch.float32, out=out)
        return acc
    return acc.add_(_mm_f32(a, b))


def _n_valid_scale(targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """1 / max(n_valid, 1) as a float32 device scalar (no host sync)."""
    return (targets != ignore_index).sum().clamp_(min=1).to(torch.float32).reciprocal_()


def lce_chunks(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
               ce_rows: CeRows, chunk_rows: int, grad_scale: Optional[torch.Tensor], need_gh: bool,
               need_gw: bool) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """One pass over the tokens in chunks (:func:`kernels.linear_ce.run_chunks`; no autograd): the per-row
    losses (n,) float32 and, as asked, the gradients of sum_rows(loss * scale) for hidden (hidden's dtype)
    and weight (float32), the scale being ``grad_scale``: None (1), one value (numel 1) or one per token
    (n,)."""
    n = hidden.shape[0]
    per_row = grad_scale is not None and grad_scale.numel() == n and n > 1
    losses = torch.empty(n, dtype=torch.float32, device=hidden.device)

    def rows(logits: torch.Tensor, s: int, e: int, grad: Optional[torch.Tensor]) -> None:
        scale = grad_scale[s:e] if per_row else grad_scale
        losses[s:e] = ce_rows(logits, targets[s:e], ignore_index, scale, grad)

    gh, gw = linear_ce.run_chunks(hidden, weight, chunk_rows, rows, need_gh, need_gw, _accumulate)
    return losses, gh, gw


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _second_backward(name: str) -> RuntimeError:
    return RuntimeError(
        f"{name}: a second backward through the same graph (retain_graph=True) is not supported: the gradient is "
        "computed in the forward, and the first backward scaled it in place by grad_output and handed it on. Run "
        "the forward again."
    )


def make_cross_entropy(name: str, ce_rows: CeRows, scale_grad_: ScaleGrad) -> Callable[..., torch.Tensor]:
    """Register ``softmax_harness::{name}_fwd`` for these primitives and return
    ``fn(logits (N, V), targets (N,) int64, ignore_index, reduction)``, differentiable in the logits (see
    the module docstring)."""

    @torch.library.custom_op(f"softmax_harness::{name}_fwd", mutates_args=())
    def ce_fwd(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
               need_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, the loss's gradient w.r.t. the logits at grad_output = 1, or an empty tensor)."""
        inv = _n_valid_scale(targets, ignore_index) if reduction == "mean" else None
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if need_grad else _empty(logits)
        losses = ce_rows(logits, targets, ignore_index, inv, grad if need_grad else None)
        if reduction == "none":
            return losses, grad
        total = losses.sum()
        return (total * inv if inv is not None else total), grad

    @ce_fwd.register_fake
    def _ce_fwd_fake(logits, targets, ignore_index, reduction, need_grad):
        loss = logits.new_empty((logits.shape[0],) if reduction == "none" else (), dtype=torch.float32)
        grad = logits.new_empty(logits.shape) if need_grad else _empty(logits)
        return loss, grad

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets, ignore_index, reduction):
            loss, grad = ce_fwd(logits, targets, ignore_index, reduction, ctx.needs_input_grad[0])
            ctx.save_for_backward(grad)
            ctx.spent = [False]
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            if not torch.compiler.is_compiling():
                if ctx.spent[0]:
                    raise _second_backward(name)
                ctx.spent[0] = True
            (grad,) = ctx.saved_tensors
            scale_grad_(grad, grad_loss.to(torch.float32))
            return grad, None, None, None

    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
        return CrossEntropy.apply(logits, targets, int(ignore_index), reduction)

    cross_entropy.__name__ = name
    cross_entropy.ops = (ce_fwd,)  # for opcheck
    return cross_entropy


def make_linear_cross_entropy(name: str, ce_rows: CeRows, scale_grad_: ScaleGrad) -> Callable[..., torch.Tensor]:
    """Register ``softmax_harness::{name}_fwd`` / ``{name}_bwd`` for these primitives and return
    ``fn(hidden (N, C), weight (V, C), targets (N,) int64, ignore_index, reduction, chunk_rows=None)``,
    differentiable in hidden and weight (see the module docstring)."""

    @torch.library.custom_op(f"softmax_harness::{name}_fwd", mutates_args=())
    def lce_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
                chunk_rows: int, need_gh: bool, need_gw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            grads = reduction != "none" and (need_gh or need_gw)
            inv = _n_valid_scale(targets, ignore_index) if reduction == "mean" else None
            # a mean's 1 / n_valid: in the kernel (free), except for fp16, whose logit gradients would
            # underflow; there it scales the two small gradients afterwards
            late = inv is not None and hidden.dtype == torch.float16
            losses, gh, gw = lce_chunks(hidden, weight, targets, ignore_index, ce_rows, chunk_rows,
                                        None if late else inv, grads and need_gh, grads and need_gw)
            if reduction == "none":
                loss = losses
            else:
                loss = losses.sum()
                if inv is not None:
                    loss = loss * inv
                if late:
                    for g in (gh, gw):
                        if g is not None:
                            g.mul_(inv)
            gw = gw.to(weight.dtype) if gw is not None else None
        return loss, gh if gh is not None else _empty(hidden), gw if gw is not None else _empty(weight)

    @lce_fwd.register_fake
    def _lce_fwd_fake(hidden, weight, targets, ignore_index, reduction, chunk_rows, need_gh, need_gw):
        grads = reduction != "none"
        loss = hidden.new_empty((hidden.shape[0],) if reduction == "none" else (), dtype=torch.float32)
        gh = hidden.new_empty(hidden.shape) if grads and need_gh else _empty(hidden)
        gw = weight.new_empty(weight.shape) if grads and need_gw else _empty(weight)
        return loss, gh, gw

    @torch.library.custom_op(f"softmax_harness::{name}_bwd", mutates_args=())
    def lce_bwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                grad_rows: torch.Tensor, chunk_rows: int, need_gh: bool,
                need_gw: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            scale = grad_rows.to(torch.float32).contiguous()
            _, gh, gw = lce_chunks(hidden, weight, targets, ignore_index, ce_rows, chunk_rows, scale, need_gh, need_gw)
            gw = gw.to(weight.dtype) if gw is not None else None
        return gh if gh is not None else _empty(hidden), gw if gw is not None else _empty(weight)

    @lce_bwd.register_fake
    def _lce_bwd_fake(hidden, weight, targets, ignore_index, grad_rows, chunk_rows, need_gh, need_gw):
        gh = hidden.new_empty(hidden.shape) if need_gh else _empty(hidden)
        gw = weight.new_empty(weight.shape) if need_gw else _empty(weight)
        return gh, gw

    class LinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, targets, ignore_index, reduction, chunk_rows):
            need_gh, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            loss, gh, gw = lce_fwd(hidden, weight, targets, ignore_index, reduction, chunk_rows, need_gh, need_gw)
            if reduction == "none":
                ctx.save_for_backward(hidden, weight, targets)
            else:
                ctx.save_for_backward(gh, gw)
            ctx.reduction, ctx.ignore_index, ctx.chunk_rows = reduction, ignore_index, chunk_rows
            ctx.need = (need_gh, need_gw)
            ctx.spent = [False]
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            need_gh, need_gw = ctx.need
            if ctx.reduction == "none":
                hidden, weight, targets = ctx.saved_tensors
                gh, gw = lce_bwd(hidden, weight, targets, ctx.ignore_index, grad_loss, ctx.chunk_rows, need_gh, need_gw)
            elif torch.compiler.is_compiling():  # traced: a product Inductor fuses into the gradients' consumers
                gh, gw = ctx.saved_tensors  # (scaled in place, the saved gradients would first be copied)
                g = grad_loss.to(torch.float32)
                gh = (gh.float() * g).to(gh.dtype) if need_gh else None  # (fp32 products, as scale_grad_'s)
                gw = (gw.float() * g).to(gw.dtype) if need_gw else None
            else:
                if ctx.spent[0]:
                    raise _second_backward(name)
                ctx.spent[0] = True
                gh, gw = ctx.saved_tensors
                g = grad_loss.to(torch.float32)
                if need_gh:
                    scale_grad_(gh, g)
                if need_gw:
                    scale_grad_(gw, g)
            return gh if need_gh else None, gw if need_gw else None, None, None, None, None

    def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                             reduction: str, chunk_rows: Optional[int] = None) -> torch.Tensor:
        hidden, weight = linear_ce.compute_pair(hidden, weight, name)  # (the autocast dtype)
        if chunk_rows is None:
            chunk_rows = linear_ce.chunk_rows(hidden.shape[0], weight.shape[0], hidden.element_size())
        return LinearCrossEntropy.apply(hidden, weight, targets, int(ignore_index), reduction, int(chunk_rows))

    linear_cross_entropy.__name__ = name
    linear_cross_entropy.ops = (lce_fwd, lce_bwd)  # for opcheck
    return linear_cross_entropy


_MADE: dict = {}


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                                 reduction: str, ce_rows: CeRows, scale_grad_: ScaleGrad,
                                 chunk_rows: Optional[int] = None) -> torch.Tensor:
    """The loss of ``hidden @ weight.T`` against ``targets`` by the chunked driver with these primitives
    (the ops are registered on the first call per pair; for torch.compile use
    :func:`make_linear_cross_entropy` at import instead)."""
    key = (ce_rows, scale_grad_)
    fn = _MADE.get(key)
    if fn is None:
        fn = _MADE[key] = make_linear_cross_entropy(f"chunked_lce_{len(_MADE)}", ce_rows, scale_grad_)
    return fn(hidden, weight, targets, ignore_index, reduction, chunk_rows)
