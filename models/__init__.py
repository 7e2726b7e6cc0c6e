"""The transformer (GPT-style decoder) with a softmax seam; knows nothing of the softmax methods."""

from models.gpt import (
    GPT,
    CausalSelfAttention,
    GPTConfig,
    MaterializedAttention,
    SDPAttention,
    SoftmaxFn,
    attention_cores,
    eager_softmax,
    swap_attention_cores,
)

__all__ = [
    "GPT",
    "CausalSelfAttention",
    "GPTConfig",
    "MaterializedAttention",
    "SDPAttention",
    "SoftmaxFn",
    "attention_cores",
    "eager_softmax",
    "swap_attention_cores",
]
