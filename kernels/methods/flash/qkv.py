"""The flash attention of one projection's output (the ``attention_qkv`` op): q, k and v are read as views
of qkv (B, T, (H + 2 Hkv) d) (Hkv = H: (B, T, 3 C); Hkv < H: grouped-query attention, the kv heads after
the query heads), and the backward writes their gradients into one tensor of qkv's shape, qkv's gradient.

Why it exists: through the ``attention`` op the model splits its projection into q, k and v, and
autograd's backward of that split concatenates the three gradients the attention returns: a copy of
3 B T C elements a layer (in ``gpt2s``, 75.5 MB read and 75.5 MB written, eager and compiled alike:
Inductor cannot have an opaque op write into its concatenation). Here the kernels write them in place.
Registered as the torch ops ``softmax_harness::flash_attention_qkv_fwd`` (-> out, lse) and
``softmax_harness::flash_attention_qkv_bwd`` (-> dqkv), same kernels as ``ops``.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from kernels.methods.flash.ops import check_dropout, check_inputs, validate


def split(qkv: torch.Tensor, n_head: int, n_kv_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, n_head, T, d), k and v (B, n_kv_head, T, d) as views of qkv (B, T, (n_head + 2 n_kv_head) d)."""
    B, T, C = qkv.shape
    if n_head < 1 or n_kv_head < 1 or n_head % n_kv_head or C % (n_head + 2 * n_kv_head):
        raise ValueError(f"flash attention_qkv takes qkv (B, T, (n_head + 2 n_kv_head) d) with n_kv_head dividing "
                         f"n_head; got {C} columns, n_head={n_head}, n_kv_head={n_kv_head}")
    d = C // (n_head + 2 * n_kv_head)
    q, k, v = qkv.split([n_head * d, n_kv_head * d, n_kv_head * d], dim=2)
    return tuple(t.view(B, T, h, d).transpose(1, 2) for t, h in ((q, n_head), (k, n_kv_head), (v, n_kv_head)))


def _forward(qkv: torch.Tensor, n_head: int, n_kv_head: int, scale: float,
             causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = split(qkv, n_head, n_kv_head)
    check_inputs(q, k, v)
    return launch_fwd(q, k, v, scale, causal)


def _backward(do: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, n_head: int,
              n_kv_head: int, scale: float, causal: bool) -> torch.Tensor:
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    launch_bwd(do, *split(qkv, n_head, n_kv_head), out, lse, scale, causal, grads=split(dqkv, n_head, n_kv_head))
    return dqkv


@torch.library.custom_op("softmax_harness::flash_attention_qkv_fwd", mutates_args=())
def flash_attention_qkv_fwd(qkv: torch.Tensor, n_head: int, scale: float, causal: bool,
                            n_kv_head: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, T, d) in qkv's dtype, laid out as (B, T, H, d); lse (B, H, T) fp32). n_kv_head 0: n_head."""
    validate(qkv)
    return _forward(qkv, n_head, n_kv_head or n_head, scale, causal)


@flash_attention_qkv_fwd.register_fake
def _(qkv, n_head, scale, causal, n_kv_head=0):
    B, T, C = qkv.shape
    n_kv_head = n_kv_head or n_head
    out = qkv.new_empty((B, T, n_head, C // (n_head + 2 * n_kv_head))).transpose(1, 2)
    return out, qkv.new_empty((B, n_head, T), dtype=torch.float32)


@torch.library.custom_op("softmax_harness::flash_attention_qkv_bwd", mutates_args=())
def flash_attention_qkv_bwd(do: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                            n_head: int, scale: float, causal: bool, n_kv_head: int = 0) -> torch.Tensor:
    """dqkv of qkv's shape, contiguous. n_kv_head 0: n_head."""
    return _backward(do, qkv, out, lse, n_head, n_kv_head or n_head, scale, causal)


@flash_attention_qkv_bwd.register_fake
def _(do, qkv, out, lse, n_head, scale, causal, n_kv_head=0):
    return torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)


def _setup_context(ctx, inputs, output) -> None:
    qkv, n_head, scale, causal, *rest = inputs
    n_kv_head = rest[0] if rest else 0
    out, lse = output
    ctx.save_for_backward(qkv, out, lse)
    ctx.n_head, ctx.n_kv_head, ctx.scale, ctx.causal = n_head, n_kv_head, scale, causal
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, d_out: torch.Tensor, _d_lse: Optional[torch.Tensor]):
    qkv, out, lse = ctx.saved_tensors
    return (flash_attention_qkv_bwd(d_out, qkv, out, lse, ctx.n_head, ctx.scale, ctx.causal, ctx.n_kv_head),
            None, None, None, None)


flash_attention_qkv_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class _EagerAttentionQKV(torch.autograd.Function):
    """The eager route (the launchers without the custom ops' Python dispatch; as ``ops._EagerAttention``)."""

    @staticmethod
    def forward(ctx, qkv, n_head: int, n_kv_head: int, scale: float, causal: bool):
        out, lse = _forward(qkv, n_head, n_kv_head, scale, causal)
        ctx.save_for_backward(qkv, out, lse)
        ctx.n_head, ctx.n_kv_head, ctx.scale, ctx.causal = n_head, n_kv_head, scale, causal
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        qkv, out, lse = ctx.saved_tensors
        return (_backward(d_out, qkv, out, lse, ctx.n_head, ctx.n_kv_head, ctx.scale, ctx.causal),
                None, None, None, None)


def flash_attention_qkv(qkv: torch.Tensor, n_head: int, scale: float, causal: bool,
                        dropout_p: float, n_kv_head: Optional[int] = None) -> torch.Tensor:
    """The method's attention_qkv op (qkv already checked against the contract): (B, n_head, T, d);
    n_kv_head (None: n_head) the kv heads of grouped-query attention."""
    check_dropout(dropout_p)
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if torch.compiler.is_compiling():
        return flash_attention_qkv_fwd(qkv, n_head, scale, causal, n_kv_head)[0]
    if torch.is_grad_enabled() and qkv.requires_grad:
        return _EagerAttentionQKV.apply(qkv, n_head, n_kv_head, scale, causal)
    return _forward(qkv, n_head, n_kv_head, scale, causal)[0]
