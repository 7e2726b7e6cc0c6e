"""The flash torch ops (``softmax_harness::flash_attention_fwd`` / ``_bwd``: custom ops with fake
implementations and autograd, so torch.compile(fullgraph=True) traces through them and
torch.library.opcheck passes), the input checks, and the method's attention function."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from kernels.methods.flash.tiles import empty_grad, interpreter_enabled
from kernels.runtime.availability import unavailable_reason  # noqa: F401  (the method's: Triton runs here)

#: The dtypes the kernels take (fp32 runs full-precision dots: correct, far from tensor-core speed).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128


def validate(q: torch.Tensor) -> None:
    """Reject what the kernels cannot take, before any work (q's dtype is k's and v's: the contract)."""
    if not q.is_cuda and not interpreter_enabled():
        raise ValueError(
            f"the flash attention runs on CUDA tensors; got q on {q.device} (TRITON_INTERPRET=1 runs "
            "Triton's CPU interpreter, for tests)"
        )
    if q.dtype not in DTYPES:
        raise TypeError(f"flash attention takes float16, bfloat16 or float32 inputs; got {q.dtype}")


def check_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise ValueError(
            f"flash attention has no dropout (got dropout_p={dropout_p}); methods that drop out: sdpa "
            "(inside its fused kernel), and the methods whose attention is composed from their softmax "
            "(torch, naive, compile, triton, cuda)"
        )


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    d, dv = q.shape[-1], v.shape[-1]
    if d > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
        raise ValueError(
            f"flash attention takes head dimensions up to {MAX_HEAD_DIM} (any d from 1, padded to the "
            f"next power of two); got d={d}, dv={dv} (sdpa takes larger heads)"
        )


@torch.library.custom_op("softmax_harness::flash_attention_fwd", mutates_args=())
def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Tq, dv) in q's dtype, lse (B, H, Tq) fp32: the natural log-sum-exp of each row's
    scaled scores, +inf for a row with no key)."""
    validate(q)
    check_inputs(q, k, v)
    return launch_fwd(q, k, v, scale, causal)


@flash_attention_fwd.register_fake
def _(q, k, v, scale, causal):
    B, H, TQ, _ = q.shape
    out = q.new_empty((B, TQ, H, v.shape[-1])).transpose(1, 2)
    return out, q.new_empty((B, H, TQ), dtype=torch.float32)


@torch.library.custom_op("softmax_harness::flash_attention_bwd", mutates_args=())
def flash_attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, scale: float,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each in its input's strides where that is dense, else laid out as (B, T, H, d)
    (tiles.empty_grad)."""
    return launch_bwd(do, q, k, v, out, lse, scale, causal)


@flash_attention_bwd.register_fake
def _(do, q, k, v, out, lse, scale, causal):
    return empty_grad(q), empty_grad(k), empty_grad(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.causal = scale, causal
    ctx.mark_non_differentiable(lse)


def _backward(ctx, d_out: torch.Tensor, _d_lse: Optional[torch.Tensor]):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_bwd(d_out, q, k, v, out, lse, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None


flash_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The eager route: the launchers without the custom ops' Python dispatch (same kernels, same
    results; under torch.compile the custom ops are traced instead)."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, causal: bool):
        out, lse = launch_fwd(q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = launch_bwd(d_out, q, k, v, out, lse, ctx.scale, ctx.causal)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                    dropout_p: float) -> torch.Tensor:
    """The method's attention op (inputs already checked against the contract; the op checks the rest)."""
    check_dropout(dropout_p)
    if torch.compiler.is_compiling():
        return flash_attention_fwd(q, k, v, scale, causal)[0]
    check_inputs(q, k, v)  # (validate ran in the contract's wrapper: kernels.contract.checked)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, scale, causal)
    return launch_fwd(q, k, v, scale, causal)[0]
