"""Config checks of the model family (``model.family``, the Llama-family keys, a Hugging Face model's
``model.hf``: harness.hf) and of the tokenizer (``data.tokenizer``): each finds the first value that is
not accepted and returns it as (key, value, what is accepted), for harness.config.validate to raise in
its one format; None when all is well."""

from __future__ import annotations

from typing import Any, Optional

from harness.tokenizer import BPE, BYTE_VOCAB, BYTES, TokenizerError, tokenizer_file_vocab

MODEL_FAMILIES = ("gpt", "llama", "hf")  # models.GPT, models.Llama, a transformers causal LM (harness.hf)
#: the Llama family's keys that a GPT leaves null (None: the family's default)
LLAMA_KEYS = ("n_kv_head", "mlp_hidden", "rope_theta", "norm_eps", "tied")

Problem = Optional[tuple[str, Any, str]]


def model_problem(c) -> Problem:
    """The model family's keys (grouped k and v run through every method's attention: kernels.attention
    takes them)."""
    m = c.model
    if m.family not in MODEL_FAMILIES:
        return "model.family", m.family, f"one of {', '.join(MODEL_FAMILIES)}"
    if m.family != "hf" and (m.hf.config is not None or m.hf.path is not None):
        return "model.hf", {"config": m.hf.config, "path": m.hf.path}, f"null with model.family={m.family} (a Hugging Face model: model.family=hf)"
    if m.family == "hf":
        for key in ("rope_theta", "norm_eps", "tied"):
            if getattr(m, key) is not None:
                return (f"model.{key}", getattr(m, key), "null with model.family=hf (the HF config holds it: "
                        "model.hf.config)")
        for key in ("bias", "qkv_bias"):
            if getattr(m, key):
                return f"model.{key}", True, "false with model.family=hf (the HF config holds it: model.hf.config)"
        # here: harness.hf imports torch and transformers, which only model.family=hf needs (the config stays light)
        from harness.hf import hf_problem

        return hf_problem(c)
    if m.family == "gpt":
        for key in LLAMA_KEYS:
            value = getattr(m, key)
            if value is not None:
                return f"model.{key}", value, "null with model.family=gpt (a Llama-family key: model.family=llama)"
        if m.qkv_bias:
            return "model.qkv_bias", m.qkv_bias, "false with model.family=gpt (model.bias sets the GPT's biases)"
        return None
    if m.bias:
        return "model.bias", m.bias, "false with model.family=llama (its one optional bias is model.qkv_bias, Qwen2's)"
    kv = m.n_head if m.n_kv_head is None else m.n_kv_head
    if kv < 1 or m.n_head % kv:
        return ("model.n_kv_head", m.n_kv_head, f"a divisor of model.n_head ({m.n_head}): each key/value head serves "
                "model.n_head / model.n_kv_head query heads")
    if (m.n_embd // m.n_head) % 2:
        return ("model.n_embd", m.n_embd, f"model.n_head ({m.n_head}) times an even head dimension (this one is "
                f"{m.n_embd // m.n_head}): RoPE turns pairs of it")
    if m.mlp_hidden is None or m.mlp_hidden < 1:
        return "model.mlp_hidden", m.mlp_hidden, "an integer >= 1 with model.family=llama (the SwiGLU's hidden width)"
    for key in ("rope_theta", "norm_eps"):
        value = getattr(m, key)
        if value is not None and not value > 0:
            return f"model.{key}", value, "null (the default) or a float > 0"
    return None


def tokenizer_problem(c) -> Problem:
    """``data.tokenizer`` and the vocabularies: a bpe's size or a tokenizer.json's at most the model's; a
    path that exists and reads as a tokenizer. Synthetic data has no text: its tokenizer plays no part."""
    d, model_vocab = c.data, c.model.vocab_size
    if d.name == "synthetic":
        if model_vocab is not None and d.vocab_size is not None and d.vocab_size > model_vocab:
            return ("data.vocab_size", d.vocab_size, f"at most model.vocab_size ({model_vocab}): synthetic tokens are "
                    "ids the model's embedding must hold (or model.vocab_size=null: the data's)")
        return None
    if d.tokenizer == BYTES:
        return None
    if d.tokenizer == BPE:
        v = d.vocab_size
        if v is None or v < BYTE_VOCAB:
            return ("data.vocab_size", v, f"an integer >= {BYTE_VOCAB} with data.tokenizer=bpe: the BPE's vocabulary "
                    "(its 256 bytes, then the merges it learns; the Llama-family configs take model.vocab_size)")
        if model_vocab is not None and v > model_vocab:
            return ("data.vocab_size", v, f"at most model.vocab_size ({model_vocab}) with data.tokenizer=bpe: the "
                    "model's embedding must hold every token the BPE makes")
        return None
    try:
        v = tokenizer_file_vocab(d.tokenizer)
    except TokenizerError as exc:
        return ("data.tokenizer", d.tokenizer, f"{BYTES}, {BPE}, or the path of a tokenizer.json the tokenizers "
                f"library reads ({exc})")
    if model_vocab is not None and v > model_vocab:
        return ("data.tokenizer", d.tokenizer, f"a tokenizer of at most model.vocab_size ({model_vocab}) tokens; this "
                f"one has {v} (a larger model.vocab_size, or null: the tokenizer's)")
    return None
