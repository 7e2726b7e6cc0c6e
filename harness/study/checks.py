"""The study's own config checks, which the command line runs before any work or directory (exit
status 2, one paragraph naming the key, the value and what is accepted): every check of a training run
(harness.config), then the study's keys: known methods and models, a parity window inside the run,
probe points on window boundaries, sweep points that make sense, and loss-split twins that each listed
configuration can have (harness.study.plan).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Callable, Mapping, Optional

from omegaconf import DictConfig, open_dict

import kernels
from harness.accel import LOSS_OPS
from harness.build import gpu_here, seq_len
from harness.config import ConfigError, accel_methods, patch_words, validate
from harness.memory import GIB, available_memory, param_count, step_memory
from harness.study import plan


def _known(key: str, names, choices: list[str], where: str) -> None:
    bad = [n for n in ([names] if isinstance(names, str) else list(names)) if n not in choices]
    if bad:
        raise ConfigError(
            f"config value {key}={bad[0]!r} is not accepted: no such configuration in {where}; the ones there "
            f"are: {', '.join(choices)}. No study was started."
        )


def validate_study(cfg: DictConfig) -> None:
    """Every check of a training run (harness.train's), plus the study's keys: known methods and
    models, a parity window inside the run, probe points on window boundaries, sweep points that
    make sense (each model of a model sweep checked as it runs). Raises ConfigError (a ValueError) naming
    the key, the value and what is accepted."""
    validate(plan.with_study_vocab(cfg))
    if cfg.data.name == "text" and not Path(str(cfg.data.path)).expanduser().is_file():
        raise ConfigError(f"data.path={cfg.data.path!r}: no such file (data=text needs an existing text file). "
                          "No study was started.")
    s, t = cfg.study, cfg.trainer
    names = plan.accel_names()  # (plan's: the one list a test extends)
    if s.methods is not None:
        _known("study.methods", s.methods, names, "conf/accel/")
    _known("study.compiled", s.compiled, names, "conf/accel/")
    _known("study.reference", s.reference, names, "conf/accel/")
    _known("study.baseline", s.baseline, names, "conf/accel/")
    for key in plan.KEYS:
        _known(f"study.{key}", s[key], names, "conf/accel/")

    def bad(key: str, value, accepted: str) -> ConfigError:
        return ConfigError(f"config value {key}={value!r} is not accepted: {accepted}. No study was started.")

    if s.parity_steps is not None and not 1 <= s.parity_steps <= t.max_steps:
        raise bad("study.parity_steps", s.parity_steps,
                  f"null (the whole run) or an integer from 1 to trainer.max_steps ({t.max_steps}): parity compares "
                  "the loss over the first study.parity_steps steps of each run, so the window cannot be longer "
                  "than the run (raise trainer.max_steps, or lower study.parity_steps)")
    every = s.parity_every if s.parity_every is not None else t.window
    if every < 1 or every % t.window:
        raise bad("study.parity_every", s.parity_every,
                  f"null (trainer.window) or a multiple of trainer.window ({t.window}), so that the probe never "
                  "falls inside a throughput window")
    if every > (s.parity_steps or t.max_steps):
        raise bad("study.parity_every", s.parity_every,
                  f"at most the parity window ({s.parity_steps or t.max_steps} steps), so that the probe runs "
                  "after some training")
    if s.parity_batches < 1:
        raise bad("study.parity_batches", s.parity_batches, "an integer >= 1")
    if not s.parity_k > 0:
        raise bad("study.parity_k", s.parity_k, "a number > 0")
    if not s.parity_floor >= 0:
        raise bad("study.parity_floor", s.parity_floor, "a number >= 0")
    if s.parity_tol is not None and not s.parity_tol > 0:
        raise bad("study.parity_tol", s.parity_tol, "null (derived from the reference's spread) or a number > 0")
    if s.repeats < 1:
        raise bad("study.repeats", s.repeats, "an integer >= 1")
    if s.sweep is not None and s.sweep not in plan.SWEEPS:
        raise bad("study.sweep", s.sweep, f"null (no sweep) or one of {', '.join(plan.SWEEPS)}")
    if s.sweep == "context":
        contexts = list(s.contexts)
        if not contexts or any(not isinstance(c, int) or c < 1 for c in contexts):
            raise bad("study.contexts", contexts, "a non-empty list of positive integers (sequence lengths)")
        tokens = s.tokens_per_step or int(cfg.data.batch_size) * int(cfg.data.seq_len or cfg.model.context)
        uneven = [c for c in contexts if tokens % c or tokens < c]
        if uneven:
            raise bad("study.tokens_per_step", tokens,
                      f"a multiple of every swept context (batch = tokens / T); {uneven[0]} does not divide it. "
                      "Set study.tokens_per_step to a multiple of the largest context")
    if s.sweep == "model":
        if not list(s.models):
            raise bad("study.models", list(s.models), "a non-empty list of model configs")
        _known("study.models", s.models, plan.model_names(), "conf/model/")
        for point in plan.sweep_points(cfg):
            validate(point.cfg)
    if s.vocab_size is not None and s.vocab_size < 2:
        raise bad("study.vocab_size", s.vocab_size, "null (the data's vocabulary) or an integer >= 2")
    if s.tokens_per_step is not None and s.tokens_per_step < 1:
        raise bad("study.tokens_per_step", s.tokens_per_step, "null or an integer >= 1")
    check_twins(s, names, bad)
    if s.sweep is None:
        reference_fits(cfg)


def reference_fits(cfg: DictConfig) -> None:
    """The reference's training step fits the device (harness.memory's estimate, the one its run would be
    refused by): without its reference a study judges nothing (no parity, no speedups), so it is refused
    before any run, naming the references that fit here. (A sweep's points may outgrow it on purpose:
    there its rows say so.)"""
    if os.environ.get("HARNESS_SKIP_MEMORY_CHECK"):
        return
    gpu = gpu_here(cfg)
    available = available_memory(gpu)
    if not available:
        return
    ref, study_cfg = str(cfg.study.reference), plan.with_study_vocab(cfg)
    counted = param_count(study_cfg)  # (once: ~1 s of building the model on the meta device each time)
    need = _step_gib(study_cfg, ref, gpu, counted)
    if need * GIB <= available:
        return
    fit = [f"{name} ({gib:.1f} GiB)" for name in plan.accel_names() if name != ref and _exact_here(cfg, name)
           for gib in [_step_gib(study_cfg, name, gpu, counted)] if gib * GIB <= available]
    where = "free on the GPU" if gpu else "of RAM available"
    raise ConfigError(
        f"study.reference={ref!r} cannot run here: one training step of model={cfg.model.name} (batch "
        f"{cfg.data.batch_size}, context {seq_len(cfg)}) needs about {need:.1f} GiB and {available / GIB:.1f} GiB is "
        f"{where}. A study without its reference run judges nothing (no parity, no speedups). "
        + (f"References whose step fits here: {', '.join(fit)} (study.reference=<name>)" if fit else
           "No reference's step fits here at this size") + "; or a smaller data.batch_size or model. No study was "
        "started. (HARNESS_SKIP_MEMORY_CHECK=1 skips this check.)")


def _step_gib(cfg: DictConfig, name: str, gpu: bool, counted: tuple[int, int]) -> float:
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.accel = plan.accel_for(name)
    return step_memory(c, gpu, counted).total / GIB


def _exact_here(cfg: DictConfig, name: str) -> bool:
    """Whether the accel configuration ``name`` runs here on ``cfg``'s model and can be a reference (exact,
    not approximate)."""
    a = plan.accel_for(name)
    if plan.unavailable(name) or (a.get("model_patch") and cfg.model.family != "hf"):
        return False
    ms = [kernels.get_method(x) for x, _ in accel_methods(a.method, a.loss_method, patch=a.patch)]
    return all(m.exact and not m.approximate for m in ms)


# -- the loss split's twins --------------------------------------------------------------------


def _misfit(a, variant: str, registered: Mapping) -> Optional[str]:
    """Why the configuration ``a`` (an AccelConfig) cannot get the twin ``variant`` (None: it can);
    ``registered``: method -> the ops it provides. The loss op is looked for in ``a.loss_method``."""
    loss_method = a.get("loss_method") or a.method
    for name in dict.fromkeys((a.method, loss_method)):
        if registered.get(name) is None:
            return f"its {'method' if name == a.method else 'loss_method'} {name!r} is not registered"
    ops, loss_ops = registered[a.method], registered[loss_method]

    def its(op: str) -> str:
        from_loss = op in LOSS_OPS.values() and loss_method != a.method
        key, name, have = ("loss_method", loss_method, loss_ops) if from_loss else ("method", a.method, ops)
        return f"its {key} {name!r} provides {', '.join(have) or 'nothing'}"

    asked = patch_words(a.patch, a.loss_form)
    if variant == "attention":
        missing = [op for op, have in (("attention", ops), (LOSS_OPS[a.loss_form], loss_ops)) if op not in have]
        if missing:
            by = {its(op): [m for m in missing if its(m) == its(op)] for op in missing}
            return "; ".join(f"{who}: no {' and no '.join(ops_)}" for who, ops_ in by.items())
        if asked != patch_words(["attention", "loss"], a.loss_form):
            return f"it patches {asked} only"
    if variant == "linear":
        if "linear_cross_entropy" not in loss_ops:
            return f"{its('linear_cross_entropy')}, no linear_cross_entropy"
        if "loss" not in list(a.patch) or a.loss_form != "logits":
            return f"it patches {asked}, not the loss on the logits"
    return None


WHAT = {"attention": "runs each configuration it lists once more with accel.patch=[attention], to show what its "
                     "loss kernel adds, so each must patch both the attention and the loss",
        "linear": "runs each configuration it lists once more with accel.loss_form=linear (the fused linear "
                  "cross-entropy), so each must patch the loss on the logits with a method that provides "
                  "linear_cross_entropy"}


def check_twins(study: Mapping, names: list[str], bad: Callable) -> None:
    """study.loss_split and study.linear_loss (known names are checked before): every configuration
    listed can get its twin. ``bad(key, value, accepted)`` makes the ConfigError."""
    registered = {n: a.ops for n, a in kernels.available_methods(include_timing_only=True).items()}
    for key, variant in plan.KEYS.items():
        for name in list(study.get(key) or []):
            why = _misfit(plan.accel_for(name, ""), variant, registered)
            if why:
                fits = [n for n in names if not _misfit(plan.accel_for(n, ""), variant, registered)]
                raise bad(f"study.{key}", name, f"study.{key} {WHAT[variant]}; {name} cannot: {why}. Those that "
                                                f"can: {', '.join(fits) or 'none'} ([] for none)")
