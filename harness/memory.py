"""Will one training step fit? An estimate of a step's peak memory from the config, checked against
what the device has before any work: refused (exit 2) above what is available, warned above 80%.

The estimate, in bytes, for P parameters, batch B, sequence T, width d, L layers, h heads, MLP width
f, vocabulary V, activations of ``a`` bytes an element (4 in fp32, 2 under 16-bit precision):

* weights, gradients and AdamW's two moments, all fp32 (mixed precision keeps fp32 weights): 16 P;
* per layer, the activations autograd keeps for the backward (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", counted in elements): attention
  5.5 B T d + 2.5 h B T^2 (scores, softmax output and its dropout mask; the T^2 term only where the
  attention keeps its scores: the model's own attention or one composed from a softmax, not a fused
  one, :func:`keeps_scores`), the two norms 2 B T d, the MLP 1.5 B T d + 2 B T f (GELU) or
  B T d + 3 B T f (SwiGLU: gate, up and their product); times a;
* the logits of the loss, unless the patched loss takes ``accel.loss_form=linear``: B T V in the
  compute dtype, an fp32 copy (the loss upcasts) and its fp32 gradient, a + 8 bytes an element; the
  linear form computes them in chunks and keeps none of that size, nor does a model patch whose loss
  is a fused linear cross-entropy (Liger's, by its default).

Allocator slack, the optimizer's temporaries and the framework's own memory are not counted: hence
the warning at 80% of what is available rather than 100%.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from omegaconf import DictConfig

import kernels
from harness.build import build_model, compute_dtype, resolve_precision, seq_len
from harness.model_patch import patch_fuses_loss

#: above this fraction of the available memory the run is warned that it may not fit
WARN_FRACTION = 0.8
GIB = 2 ** 30


class MemoryEstimateError(ValueError):
    """A training step's estimated memory exceeds what the device has (a user error: exit 2)."""


@dataclass
class StepMemory:
    """A step's estimated memory by part, in bytes."""

    params: int  # how many parameters
    states: int  # weights + gradients + AdamW moments
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.states + self.activations + self.logits


def param_count(cfg: DictConfig) -> tuple[int, int]:
    """The model's parameters and its vocabulary, built on the meta device (no memory, no initialisation;
    the vocabulary as build_model chooses it: a Hugging Face config may state its own)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters()), int(model.config.vocab_size)


def keeps_scores(cfg: DictConfig, gpu: bool) -> bool:
    """Whether the run's attention keeps the T x T scores for the backward: the model's own attention (not
    patched) and one composed from a softmax do; a method's native attention does not, unless the method
    says its unfused fallback runs here (``Method.keeps_scores``: SDPA's math path). An unknown method
    counts as keeping them."""
    accel = cfg.accel
    if "attention" not in list(accel.patch):
        return True
    method = kernels.registered(str(accel.method))
    if method is None or method.provides("attention") != "native":
        return True
    if method.keeps_scores is None:
        return False
    m = cfg.model
    return bool(method.keeps_scores(
        dict(accel.options or {}), cuda=gpu,
        float32=compute_dtype(resolve_precision(str(cfg.trainer.precision), gpu)) == torch.float32,
        grouped=m.get("n_kv_head") is not None and int(m.n_kv_head) < int(m.n_head),
        dropout=float(m.get("dropout") or 0.0)))


def step_memory(cfg: DictConfig, gpu: bool, counted: Optional[tuple[int, int]] = None) -> StepMemory:
    """The estimate of one training step's peak memory (the formula: this module's docstring). ``counted``:
    :func:`param_count` of ``cfg`` where the caller has it (the accel configuration changes no parameter:
    estimating one model under several methods counts them once)."""
    m = cfg.model
    b, t, d, layers, heads = int(cfg.data.batch_size), seq_len(cfg), int(m.n_embd), int(m.n_layer), int(m.n_head)
    a = torch.finfo(compute_dtype(resolve_precision(str(cfg.trainer.precision), gpu))).bits // 8
    if m.family == "llama" or (m.family == "hf" and m.mlp_hidden):
        f = int(m.mlp_hidden)  # (a Hugging Face model's counted as a SwiGLU's: its 2-matrix MLP keeps less)
        mlp = b * t * d + 3 * b * t * f
    else:
        f = 4 * d
        mlp = 1.5 * b * t * d + 2 * b * t * f
    scores = 2.5 * heads * b * t * t if keeps_scores(cfg, gpu) else 0
    per_layer = 5.5 * b * t * d + scores + 2 * b * t * d + mlp
    p, vocab = counted or param_count(cfg)
    acc = cfg.accel  # (a linear loss form only where the loss is patched: else the model's own loss on the logits)
    fused = ("loss" in list(acc.patch) and acc.loss_form != "logits") or patch_fuses_loss(
        acc.get("model_patch"), dict(acc.get("model_patch_options") or {}))
    logits = 0 if fused else b * t * vocab * (a + 8)
    return StepMemory(params=p, states=16 * p, activations=int(layers * per_layer * a), logits=int(logits))


def available_memory(gpu: bool) -> Optional[int]:
    """Bytes the step can use: the GPU's free memory, or the CPU's available RAM (psutil if installed,
    else /proc/meminfo's MemAvailable); None when nothing says."""
    if gpu:
        return int(torch.cuda.mem_get_info()[0])
    try:
        import psutil  # optional: not a dependency of the harness

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_step_memory(cfg: DictConfig, gpu: bool, available: Optional[int] = None) -> Optional[str]:
    """Raise :class:`MemoryEstimateError` when the step's estimate exceeds ``available`` (default: what
    the device has now); return a warning above 80% of it, else None."""
    if os.environ.get("HARNESS_SKIP_MEMORY_CHECK"):
        return None
    available = available_memory(gpu) if available is None else available
    if not available:
        return None
    est = step_memory(cfg, gpu)
    where = "free on the GPU" if gpu else "of RAM available"
    said = (f"one training step of model={cfg.model.name} (batch {cfg.data.batch_size}, context {seq_len(cfg)}, "
            f"{est.params / 1e6:.0f}M parameters) needs about {est.total / GIB:.1f} GiB (weights, gradients and "
            f"AdamW state {est.states / GIB:.1f}, activations {est.activations / GIB:.1f}, logits "
            f"{est.logits / GIB:.1f}) and {available / GIB:.1f} GiB is {where}")
    change = ("a smaller data.batch_size, data.seq_len or model" +
              (", or accel.loss_form=linear (no full logits)" if est.logits > est.total / 10 else ""))
    if est.total > available:
        raise MemoryEstimateError(f"{said}: it would run out of memory. Use {change}. "
                                  "(HARNESS_SKIP_MEMORY_CHECK=1 skips this check.)")
    if est.total > WARN_FRACTION * available:
        return f"{said}: over {WARN_FRACTION:.0%} of it, the run may run out of memory; if it does, use {change}"
    return None
