"""Throw-away methods and the quick configuration for the study tests (and for
scripts/record_parity_curves.py, which recorded tests/data/parity_curves.json with them).

* ``_test_unnormalized``: a softmax that forgets to normalize: the numerators exp(scale * x - row max),
  masked entries 0, never divided by their sum. It stays finite (every value in [0, 1]) and trains,
  so only parity can catch it once the kernel gate is off.
* ``_test_exact_bf16``: an independent correct softmax: computed in float64 (kernels.reference_softmax;
  on a GPU, where float64 copies of gpt2s's scores would not fit, in float32 as exp(x - logsumexp)),
  rounded to bfloat16 and back, as a 16-bit kernel would. Registered ``approximate`` (its rounding is beyond the float32
  gate's tolerance), so the study judges it by parity alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

import kernels
from kernels.common import causal_mask

UNNORMALIZED = "_test_unnormalized"
CORRECT = "_test_exact_bf16"

#: the tiny model on the study's default data (the stdlib corpus) with the study's trainer (lr 6e-4,
#: 20 warm-up steps, windows of 5 steps), shrunk for the CPU: batch 4 x 64 tokens, byte vocabulary
QUICK = ["model=tiny", "study.vocab_size=null", "data.batch_size=4", "data.seq_len=64", "trainer.accelerator=cpu",
         "trainer.max_steps=30", "study.compiled=[]", "logger=none"]


def unnormalized_softmax(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    z = x.float() * scale
    if causal:
        z = z.masked_fill(causal_mask(z.shape[-2], z.shape[-1], z.device), float("-inf"))
    return torch.exp(z - z.amax(dim=-1, keepdim=True)).to(x.dtype)


def exact_bf16_softmax(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    if x.is_cuda:
        z = x.float() * scale
        if causal:
            z = z.masked_fill(causal_mask(z.shape[-2], z.shape[-1], z.device), float("-inf"))
        y = torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))  # not torch.softmax's path
    else:
        y = kernels.reference_softmax(x, scale=scale, causal=causal)
    return y.to(torch.bfloat16).to(x.dtype)


METHODS = {
    UNNORMALIZED: kernels.Method(name=UNNORMALIZED, softmax=unnormalized_softmax,
                                 summary="test: softmax numerators, never normalized"),
    CORRECT: kernels.Method(name=CORRECT, softmax=exact_bf16_softmax, approximate=True,
                            summary="test: exact softmax rounded to bfloat16"),
}


def install(setattr_) -> None:
    """Register the methods and let the study accept them as accel configs (``setattr_``: pytest's
    monkeypatch.setattr, or a plain setattr in a script)."""
    from harness.study import plan

    for m in METHODS.values():
        if m.name not in kernels.available_methods(include_timing_only=True):
            kernels.register(m)
    real_config, real_names = plan.accel_config, plan.accel_names
    setattr_(plan, "accel_config", lambda name: (
        OmegaConf.create({"name": name, "method": name}) if name in METHODS else real_config(name)))
    setattr_(plan, "accel_names", lambda: real_names() + sorted(METHODS))


def uninstall() -> None:
    for name in METHODS:
        kernels.unregister(name)


def study_cfg(*overrides: str, quick: bool = True):
    """The study's config with the QUICK CPU shape (``quick=False``: the study's own defaults)."""
    from hydra import compose, initialize_config_dir

    from harness.config import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="study", overrides=[*(QUICK if quick else []), *overrides])


FIXTURE = Path(__file__).resolve().parent / "data" / "parity_curves.json"
