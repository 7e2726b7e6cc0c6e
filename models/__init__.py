"""The transformer (GPT-style decoder) with its two seams, attention core and loss; knows nothing of
the acceleration methods."""

from models.gpt import (
    GPT,
    LOSS_FORMS,
    AttentionCore,
    AttentionFn,
    CausalSelfAttention,
    GPTConfig,
    LossFn,
    attention_cores,
    eager_attention,
    set_attention,
    set_loss,
    swap_attention_cores,
)

__all__ = [
    "GPT",
    "LOSS_FORMS",
    "AttentionCore",
    "AttentionFn",
    "CausalSelfAttention",
    "GPTConfig",
    "LossFn",
    "attention_cores",
    "eager_attention",
    "set_attention",
    "set_loss",
    "swap_attention_cores",
]
