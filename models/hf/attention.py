"""The attention seam of a Hugging Face model: one function registered in transformers' attention
registry (``AttentionInterface``) and its mask function (``AttentionMaskInterface``), both under
:data:`ATTENTION_NAME`, which the model is switched to; every decoder layer's attention then calls its
own :class:`HFAttentionSeam`, whose ``core`` is what ``models.set_attention`` swaps.

What the registered function is handed (transformers' ``integrations/sdpa_attention.py`` is the
contract it follows): the layer's module, q (B, H, T, d), k and v (B, Hkv, T, d) after RoPE and NOT
repeated (grouped-query attention reaches the core as the ``kernels.attention`` contract takes it:
no ``repeat_kv`` copy), the mask, the dropout (0 outside training), the layer's ``scaling``. It returns
(output (B, T, H, d), None): no attention weights.

Masks: the seam computes plain causal attention. The mask function builds transformers' own SDPA
mask with its causal skip allowed: None exactly when the batch needs nothing but the causal mask (no
padding, no packed sequences, no sliding window shorter than the sequence, no extra mask function);
anything else is refused (:class:`UnsupportedMaskError`, saying what was passed and what is accepted),
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
            f"attention_implementation={ATTENTION_NAME!r} is set on a {type(module).__name__} that has no harness seam: "
            "build the model through models.hf.HFCausalLM")
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
    out = seam(query, key, value, float(scale), float(dropout))  # (B, H, T, d)
    return out.transpose(1, 2), None  # (B, T, H, d), as transformers' SDPA integration returns it


def harness_mask(batch_size: int, q_length: int, kv_length: int, **kwargs: Any) -> None:
    """transformers' mask interface: None for a plain causal batch (transformers' SDPA mask, with its
    causal skip, would be None), else the mask is refused."""
    from transformers.masking_utils import sdpa_mask  # here: transformers is imported through models.hf.library

    kwargs.pop("dtype", None)
    kwargs.pop("config", None)
    mask = sdpa_mask(batch_size, q_length, kv_length, **kwargs)
    if mask is None:
        return None
    padded = kwargs.get("attention_mask")
    what = ("an attention_mask with padding (zeros)" if padded is not None and not bool(padded.all())
            else "a mask other than the causal one (packed sequences, a sliding window shorter than the sequence, "
                 "or another mask function)")
    raise UnsupportedMaskError(f"the model asked for {what} over {q_length} queries and {kv_length} keys: the "
                               f"harness's attention seam computes plain causal attention only. Accepted: {ACCEPTED}")


def register_attention() -> None:
    """The seam's attention and mask functions in transformers' registries (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface  # here: imported via models.hf.library

    AttentionInterface.register(ATTENTION_NAME, harness_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, harness_mask)
