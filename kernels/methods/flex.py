"""`flex`: PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) through ``torch.compile``:
the compile rung of fused attention. Inductor generates a Triton flash-attention kernel (forward and
backward) from the mask; the scores never exist in memory.

The causal mask is the contract's bottom-right alignment (key j visible to query i when
``j <= i + Tk - Tq``), as a block mask, so blocks above the diagonal are skipped, not masked; a query
with no key gets zeros (FlexAttention's rule for a fully masked row) and zero gradient. Block masks
are cached per (Tq, Tk, device); each shape/stride/dtype/device/causal signature gets its own
compiled function (its own code object, hence its own Dynamo cache), so repeated shapes never
recompile and many shapes never hit Dynamo's recompile limit. Inside a region torch.compile is
already tracing (whole-model compile), flex_attention is called directly and traced with the model.
Dropout is refused (FlexAttention has none; sdpa or a composed method drops out). This torch runs
FlexAttention's forward on the CPU but has no CPU backward, so the method needs a CUDA GPU.
Grouped-query attention (k and v with fewer heads than q) through FlexAttention's own
``enable_gqa=True``: k and v are never expanded.
"""

from __future__ import annotations

import types
from typing import Callable, Optional

import torch

from kernels.registry import Method, register

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _FLEX_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - torch before 2.5
    create_block_mask = flex_attention = None
    _FLEX_ERROR = f"this torch has no FlexAttention ({type(exc).__name__}: {exc})"

_COMPILED: dict[tuple, Callable] = {}
_MASKS: dict[tuple, object] = {}


def unavailable_reason() -> Optional[str]:
    if _FLEX_ERROR:
        return _FLEX_ERROR
    if not torch.cuda.is_available():
        return ("it needs a CUDA GPU: FlexAttention has no backward on the CPU in this torch (its "
                "forward runs there)")
    try:
        import triton  # noqa: F401  (Inductor's GPU kernels are Triton)
    except Exception as exc:
        return f"FlexAttention on a GPU compiles to Triton, which is not importable ({exc})"
    return None


def validate(q: torch.Tensor) -> None:
    if q.device.type != "cuda":
        raise ValueError(f"the flex method runs on CUDA tensors (no CPU backward); got q on {q.device}")


def causal_block_mask(tq: int, tk: int, device: torch.device):
    """The contract's causal mask as a BlockMask (cached per shape and device)."""
    key = (tq, tk, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        off = tk - tq

        def bottom_right(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + off

        mask = _MASKS[key] = create_block_mask(bottom_right, None, None, tq, tk, device=device)
    return mask


def _flex_call(q, k, v, block_mask, scale, enable_gqa):
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _fresh_call(tag: int) -> Callable:
    code = _flex_call.__code__.replace(co_name=f"compiled_flex_attention_{tag}")
    return types.FunctionType(code, _flex_call.__globals__, code.co_name)


def flex_attention_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                      dropout_p: float) -> torch.Tensor:
    if dropout_p:
        raise ValueError(
            f"flex attention has no dropout (got dropout_p={dropout_p}); methods that drop out: sdpa, and "
            "the methods whose attention is composed from their softmax (torch, naive, compile, triton, cuda)"
        )
    mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    gqa = k.shape[1] != q.shape[1]
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, causal)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = torch.compile(_fresh_call(len(_COMPILED)), dynamic=False, fullgraph=True)
    return fn(q, k, v, mask, scale, gqa)


def compiled_signatures() -> int:
    """How many signatures have been compiled so far (tests check shapes repeat without recompiling)."""
    return len(_COMPILED)


register(
    Method(
        name="flex",
        attention=flex_attention_fn,
        summary="FlexAttention through torch.compile (Inductor's Triton flash kernel; causal block mask)",
        unavailable_reason=unavailable_reason,
        validate=validate,
    )
)
