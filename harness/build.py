"""What a run is made of, built from its config: device and precision, data, the model with its
method applied. Shared by training, the study's profile and the benchmarks, so each builds the same
things the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from omegaconf import DictConfig

from harness.accel import Applied, apply_accel
from harness.data import Corpus, data_vocab_size, make_corpus
from harness.hf import build_hf_model
from models import GPT, GPTConfig, Llama, LlamaConfig
from models.hf import HFCausalLM

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}


def seq_len(cfg: DictConfig) -> int:
    """The training sequence length: data.seq_len, or the model's context."""
    return int(cfg.data.seq_len or cfg.model.context)


def tokens_per_step(cfg: DictConfig) -> int:
    """Tokens one rank trains on per step."""
    return int(cfg.data.batch_size) * seq_len(cfg)


def data_seed(cfg: DictConfig) -> int:
    """The seed of the batch order: data.seed, or the run's seed."""
    seed = cfg.data.get("seed")
    return int(cfg.seed if seed is None else seed)


def gpu_here(cfg: DictConfig) -> bool:
    """Whether the run would train on a GPU: trainer.accelerator auto or gpu, and one is there (no error
    for gpu without one: the checks that say so come elsewhere)."""
    return cfg.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def on_gpu(cfg: DictConfig) -> bool:
    """Whether the run trains on a GPU (trainer.accelerator auto/gpu and one is there); gpu without
    one is an error."""
    here = gpu_here(cfg)
    if cfg.trainer.accelerator in ("gpu", "cuda") and not here:
        raise RuntimeError("trainer.accelerator=gpu but no CUDA GPU is available here (use auto or cpu)")
    return here


def resolve_precision(requested: str, gpu: bool) -> str:
    if requested != "auto":
        return requested
    if gpu and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the ops see under this precision (autocast's, or float32)."""
    return AUTOCAST_DTYPES.get(precision.split("-")[0], torch.float32)


def build_model(cfg: DictConfig) -> GPT | Llama | HFCausalLM:
    """The model a config describes, of its ``model.family`` (vocabulary from the data unless
    model.vocab_size is set; a Hugging Face model's: harness.hf)."""
    if cfg.model.family == "llama":
        return build_llama(cfg)
    if cfg.model.family == "hf":
        return build_hf_model(cfg)
    return GPT(GPTConfig(
        vocab_size=int(cfg.model.vocab_size or data_vocab_size(cfg.data)),
        context=int(cfg.model.context),
        n_layer=int(cfg.model.n_layer),
        n_head=int(cfg.model.n_head),
        n_embd=int(cfg.model.n_embd),
        dropout=float(cfg.model.dropout),
        bias=bool(cfg.model.bias),
    ))


def build_llama(cfg: DictConfig) -> Llama:
    """The Llama-family model a config describes (a key left null takes LlamaConfig's default)."""
    m = cfg.model
    defaults = {key: m[key] for key in ("rope_theta", "norm_eps", "tied") if m[key] is not None}
    return Llama(LlamaConfig(
        vocab_size=int(m.vocab_size or data_vocab_size(cfg.data)), context=int(m.context), n_layer=int(m.n_layer),
        n_head=int(m.n_head), n_kv_head=int(m.n_kv_head or m.n_head), n_embd=int(m.n_embd),
        mlp_hidden=int(m.mlp_hidden), qkv_bias=bool(m.qkv_bias), dropout=float(m.dropout), **defaults,
    ))


def accel_applied(model: GPT | Llama | HFCausalLM, cfg: DictConfig) -> Applied:
    """The configured method applied to ``model`` (see harness.accel)."""
    a = cfg.accel
    return apply_accel(model, a.method, list(a.patch), a.loss_form, dict(a.options or {}),
                       loss_method=a.get("loss_method"), qkv=bool(a.get("qkv", True)),
                       model_patch=a.get("model_patch"), model_patch_options=dict(a.get("model_patch_options") or {}))


@dataclass
class Built:
    model: GPT | Llama | HFCausalLM
    applied: Applied
    corpus: Optional[Corpus]


def build(cfg: DictConfig) -> Built:
    """The corpus and the model with the method applied (CPU; Lightning moves it)."""
    corpus = make_corpus(cfg.data, seq_len(cfg))
    model = build_model(cfg)
    return Built(model, accel_applied(model, cfg), corpus)
