"""The attention seam of a Hugging Face model: one function registered in transformers' attention
registry (``AttentionInterface``) and its mask function (``AttentionMaskInterface``), both under
:data:`ATTENTION_NAME`, which the model is switched to; every decoder layer's attention then calls its
own :class:`HFAttentionSeam`, whose ``core`` is what ``models.set_attention`` swaps.

What the registered function is handed (transformers' ``integrations/sdpa_attention.py`` is the
contract it follows): the layer's module, q (B, H, T, d), k and v (B, Hkv, T, d) after RoPE and NOT
repeated (grouped-query attention reaches the core as the ``kernels.attention`` contract takes it:
no ``repeat_kv`` copy), the mask, the dropout (0 outside training), the layer's ``scaling``. It returns
(output (B, T, H, d), None): no attention weights.

Masks: the seam computes plain causal attention. The mask function returns None exactly when the
batch needs nothing but the causal mask (no padding, no packed sequences, no sliding window shorter
than the sequence, no extra mask function, no cache: :func:`harness_mask` says how it tells); anything
else is refused (:class:`UnsupportedMaskError`, saying what was passed and what is accepted),
and so is any mask that reaches the attention function, never ignored. Other arguments the seam cannot
honour (a logit softcap, attention sinks, a position bias, non-causal attention) are refused the same
way.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn as nn

from models.gpt import AttentionCore, SelfAttention
from models.llama import eager_gqa_attention

#: the name the harness's attention and mask functions are registered under in transformers
ATTENTION_NAME = "harness"
#: set on the HF config while HFCausalLM.forward runs the model on its own batch: token ids only, positions
#: the model's own 0..T-1, no cache. Under torch.compile transformers cannot tell those positions from
#: packed sequences (it would have to read them) and hands over a packed-sequence mask function; the
#: harness knows its batch is one plain causal sequence a row.
PLAIN_CAUSAL = "harness_plain_causal"
#: keyword arguments transformers may pass that change the attention beyond causal softmax(q k^T s) v
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")
ACCEPTED = ("a causal batch with no attention_mask (or one of all ones), no packed sequences, no sliding window "
            "shorter than the sequence")


class UnsupportedMaskError(ValueError):
    """A mask or attention argument the harness's attention seam cannot honour."""


class HFAttentionSeam(SelfAttention):
    """A decoder layer's attention seam: ``core(q, k, v)`` as in the harness's own models, called with
    the layer's scaling (an ``AttentionCore``'s ``attention_fn`` takes it; any other core only at
    1/sqrt(d), which is all its forward computes)."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.core: nn.Module = AttentionCore(eager_gqa_attention, dropout=dropout)  # the own models' default

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dropout_p: float
                ) -> torch.Tensor:
        core = self.core
        if isinstance(core, AttentionCore):
            return core.attention_fn(q, k, v, scale, True, dropout_p)  # (B, H, T, d)
        if not math.isclose(scale, 1.0 / math.sqrt(q.size(-1)), rel_tol=1e-6):
            raise UnsupportedMaskError(
                f"this model's attention scaling is {scale}, and the attention core {type(core).__name__} computes "
                f"1/sqrt(head_dim) = {1.0 / math.sqrt(q.size(-1))} only: use models.set_attention (its attention_fn "
                "takes the scale)")
        return core(q, k, v)


def harness_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface, computed by ``module``'s seam (``module.harness_seam``): q (B, H,
    T, d), k, v (B, Hkv, T, d) unrepeated -> ((B, T, H, d), None)."""
    seam = getattr(module, "harness_seam", None)
    if seam is None:
        raise UnsupportedMaskError(
            f"attention_implementation={ATTENTION_NAME!r} is set on a {type(module).__name__} that has no harness "
            "seam: build the model through models.hf.HFCausalLM")
    if attention_mask is not None:
        raise UnsupportedMaskError(
            f"the harness's attention seam was handed an attention mask of shape {tuple(attention_mask.shape)}: it "
            f"computes plain causal attention and cannot honour a mask. Accepted: {ACCEPTED}")
    if is_causal is False or not getattr(module, "is_causal", True):
        raise UnsupportedMaskError(f"non-causal attention in {type(module).__name__}: the harness's attention seam "
                                   "computes causal attention only")
    given = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[-2] > window:
        given.append(f"sliding_window={window} (shorter than the {key.shape[-2]} keys)")
    if given:
        raise UnsupportedMaskError(f"{type(module).__name__} passed {', '.join(given)} to its attention: the "
                                   f"harness's attention seam computes causal softmax(q k^T * scaling) v only")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.size(-1))
    query, key, value = autocast_dtypes(query, key, value)
    out = seam(query, key, value, float(scale), float(dropout))  # (B, H, T, d)
    return out.transpose(1, 2), None  # (B, T, H, d), as transformers' SDPA integration returns it


def autocast_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v in autocast's dtype where autocast is on, as SDPA (on autocast's lower-precision list) takes
    them. Under autocast a transformers model hands its attention mixed dtypes: q and k leave RoPE in
    float32 (the 16-bit projection times the float32 cos and sin of the float32 residual stream), v is the
    projection's 16-bit output. Outside autocast they pass as they are (the kernels' contract refuses mixed
    dtypes, as SDPA does)."""
    device = q.device.type
    if not torch.is_autocast_enabled(device):
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def harness_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                 mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None,
                 local_size: Optional[int] = None, allow_is_causal_skip: bool = True, **kwargs: Any) -> None:
    """transformers' mask interface: None for a plain causal batch, else the mask is refused.

    Plain causal is read from what transformers asks for, never from a built mask (under torch.compile
    transformers' own SDPA mask builds the causal mask rather than skip it, and reading a mask's values
    would break the graph): its causal mask function (or the harness's own batch, :data:`PLAIN_CAUSAL`,
    whose positions transformers cannot tell from packed sequences under compile), a sliding window or
    chunk no shorter than the keys, no extra mask (transformers clears ``allow_is_causal_skip`` for
    packed sequences, block and extra mask functions), as many keys as queries from position 0, and no
    attention_mask or one of all ones."""
    from transformers.masking_utils import causal_mask_function  # here: transformers is imported via models.hf.library

    own = bool(getattr(kwargs.get("config"), PLAIN_CAUSAL, False)) and attention_mask is None
    causal = own or (mask_function is causal_mask_function and allow_is_causal_skip)
    window = local_size is None or kv_length <= local_size
    aligned = q_length == kv_length and isinstance(q_offset, int) and q_offset == 0 and kv_offset == 0
    padded = attention_mask is not None and not bool(attention_mask.all())
    if causal and window and aligned and not padded:
        return None
    what = ("an attention_mask with padding (zeros)" if padded else
            f"{q_length} queries at offset {q_offset} over {kv_length} keys (a cache)" if not aligned else
            "a mask other than the causal one (packed sequences, a sliding window shorter than the sequence, "
            "or another mask function)")
    raise UnsupportedMaskError(f"the model asked for {what}: the harness's attention seam computes plain causal "
                               f"attention only. Accepted: {ACCEPTED}")


def register_attention() -> None:
    """The seam's attention and mask functions in transformers' registries (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface  # here: imported via models.hf.library

    AttentionInterface.register(ATTENTION_NAME, harness_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, harness_mask)
