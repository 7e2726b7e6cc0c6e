"""The transformers (a GPT-style decoder, a Llama-family decoder) with their two seams, attention core
and loss; knows nothing of the acceleration methods."""

from models.gpt import (
    GPT,
    LOSS_FORMS,
    AttentionCore,
    AttentionFn,
    CausalSelfAttention,
    GPTConfig,
    LossFn,
    SelfAttention,
    attention_cores,
    eager_attention,
    set_attention,
    set_loss,
    swap_attention_cores,
)
from models.llama import Llama, LlamaConfig, eager_gqa_attention

__all__ = [
    "GPT",
    "LOSS_FORMS",
    "AttentionCore",
    "AttentionFn",
    "CausalSelfAttention",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "LossFn",
    "SelfAttention",
    "attention_cores",
    "eager_attention",
    "eager_gqa_attention",
    "set_attention",
    "set_loss",
    "swap_attention_cores",
]
