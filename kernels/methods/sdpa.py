"""`sdpa`: PyTorch's fused attention (``scaled_dot_product_attention``); the scores never exist in
memory. The vendor references of the fused-attention rung: option ``backend`` picks SDPA's kernel
(``auto``: PyTorch's own choice, flash on an H200 under bf16; ``flash``, ``cudnn``, ``efficient``
(memory-efficient), ``math`` (the unfused reference)). A backend that cannot take the inputs raises
PyTorch's own error naming why. Implements ``attention`` only (no softmax over stored scores).

Grouped-query attention (k and v with fewer heads than q) goes through SDPA's ``enable_gqa=True``
(torch >= 2.5), k and v never expanded here. Which backends take it, from torch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (2.5-2.9): flash
(``check_batch_size_and_num_heads_dense<true>``; not on ROCm) and math (it repeats k and v itself);
the memory-efficient kernel does not (``check_batch_size_and_num_heads_dense<false>``; later sources
list it as taking GQA on CUDA), and cuDNN's checks have no head-count rule for it at all. So
``backend=efficient`` and ``backend=cudnn`` refuse Hkv < H with a message, never a silent fallback to
math; ``auto`` is PyTorch's choice among those that take it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.registry import Method, register

BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
#: the backends that take k and v with fewer heads than q (``enable_gqa``); see the module docstring
GQA_BACKENDS = ("auto", "flash", "math")


def _backend_context(backend: str):
    if backend == "auto":
        return contextlib.nullcontext()
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    return sdpa_kernel(kind)


def _causal_mask(tq: int, tk: int, device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where a key is kept (the contract's rule for Tq != Tk)."""
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    return j <= i + (tk - tq)


def check_gqa_backend(q: torch.Tensor, k: torch.Tensor, backend: str) -> bool:
    """Whether k and v are grouped (fewer heads than q); a backend that does not take that refuses."""
    grouped = k.shape[1] != q.shape[1]
    if grouped and backend not in GQA_BACKENDS:
        raise ValueError(
            f"sdpa backend={backend!r} does not take grouped-query attention (q {tuple(q.shape)}, k "
            f"{tuple(k.shape)}: {q.shape[1]} query heads on {k.shape[1]} kv heads); backends that take it: "
            f"{', '.join(GQA_BACKENDS)} (or a method with its own grouped attention: flex, torch, triton, ...)"
        )
    return grouped


def sdpa_attention(q, k, v, scale: float, causal: bool, dropout_p: float, backend: str = "auto") -> torch.Tensor:
    tq, tk = q.shape[-2], k.shape[-2]
    gqa = {"enable_gqa": True} if check_gqa_backend(q, k, backend) else {}  # (only where grouped: torch < 2.5 runs)
    with _backend_context(backend):
        if not causal or tq == tk:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, **gqa)
        # SDPA's is_causal aligns the mask to the top left for Tq != Tk; the contract aligns it to the
        # bottom right (key j kept for query i when j <= i + Tk - Tq), and a query with no key gets zeros
        keep = _causal_mask(tq, tk, q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale, **gqa)
        empty = ~keep.any(dim=-1)  # rows with no key (Tq > Tk): SDPA gives NaN there
        return out.masked_fill(empty[:, None], 0.0) if bool(tq > tk) else out


def backend_unavailable(options) -> str | None:
    backend = options.get("backend", "auto")
    if backend in ("flash", "cudnn", "efficient") and not torch.cuda.is_available():
        return f"SDPA's {backend} backend needs a CUDA GPU and none was found"
    return None


def keeps_scores(options, *, cuda: bool, float32: bool, grouped: bool, dropout: float) -> bool:
    """Whether SDPA keeps T x T scores for its backward: on its math path, chosen (``backend=math``) or where
    ``auto`` finds no fused backend for the call: on a CPU with dropout (checked with saved-tensor hooks on
    torch 2.13), on a GPU in float32 with grouped heads (the flash backend needs 16 bits; the others refuse
    grouped heads, above)."""
    backend = options.get("backend", "auto")
    if backend == "math":
        return True
    return backend == "auto" and ((not cuda and dropout > 0) or (cuda and float32 and grouped))


register(
    Method(
        name="sdpa",
        attention=sdpa_attention,
        summary="PyTorch's fused attention (scaled_dot_product_attention; backend auto|flash|cudnn|efficient|math)",
        options={"backend": BACKENDS},
        options_unavailable=backend_unavailable,
        keeps_scores=keeps_scores,
    )
)
