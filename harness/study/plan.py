"""What a study runs: the accel configurations it names (``conf/accel/``), each as it runs in the study
(its loss-split twins included), in run order, at each sweep point.

A study row is one accel configuration run as it is: it patches the softmaxes its ``accel.patch``
names (by default the attention's and the loss's). Each configuration listed in ``study.loss_split``
(default ``[triton, cuda]``) is also run with ``accel.patch=[attention]``, and each listed in
``study.linear_loss`` (default none) also with ``accel.loss_form=linear`` (the fused linear
cross-entropy, which never holds all the logits). The twins run beside every run of the configuration
in the study (eager, and with the whole model compiled when it is in ``study.compiled``), in the same
rounds, behind the same gate and parity. A listed configuration that is not in the study adds nothing.
Such a configuration's rows are labelled by what they ask to patch (harness.study.labels), and the
report divides each by its ``: attention`` twin (harness.study.ratios).

``accel_names`` and ``accel_config`` are the one place the study learns which configurations exist
(the study's checks read them here too), so a test can add throw-away methods to a study by replacing
these two.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from harness.availability import accel_unavailable
from harness.config import CONF_DIR, AccelConfig, accel_names, group_options, patch_words

#: what study.sweep can sweep
SWEEPS = ("context", "model")
#: variant -> the accel keys its runs override ("": the configuration as it is); the attention-only
#: twin patches no loss, so it drops the loss's own method (accel.loss_method) too
VARIANTS = {"": {}, "attention": {"patch": ["attention"], "loss_method": None}, "linear": {"loss_form": "linear"}}
#: study key -> the variant it adds to each configuration it lists
KEYS = {"loss_split": "attention", "linear_loss": "linear"}


class Planned(NamedTuple):
    """One row of a study's plan."""

    method: str  # the accel configuration
    compiled: bool
    variant: str = ""  # a key of VARIANTS
    patch: str = ""  # what it asks to patch, in words, shown in its label ("": the configuration is not split)


def model_names() -> list[str]:
    return group_options("model")


def accel_config(name: str) -> DictConfig:
    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"study.methods: unknown method {name!r}; options: {', '.join(accel_names())}")
    return OmegaConf.load(path)


def accel_for(name: str, variant: str = "") -> DictConfig:
    """The accel configuration ``name``, every key filled in, as its ``variant`` runs."""
    return OmegaConf.merge(OmegaConf.structured(AccelConfig), accel_config(name), VARIANTS[variant])


def unavailable(name: str, variant: str = "") -> Optional[str]:
    """Why the accel configuration ``name`` (as its ``variant`` runs) cannot run here (None: it can)."""
    a = accel_for(name, variant)
    return accel_unavailable(a.method, dict(a.options or {}), a.loss_method, list(a.patch), a.model_patch)


def default_methods(family: str = "hf") -> list[str]:
    """The default study: every accel configuration, the reference and baseline first; a whole-model
    patch's (accel.model_patch: a Hugging Face model's) only on a ``model.family=hf`` model."""
    return [n for n in accel_names() if family == "hf" or accel_config(n).get("model_patch") is None]


def variants(study: Mapping, name: str) -> list[tuple[str, str]]:
    """(variant, words) of the rows of accel configuration ``name``: itself, then its twins (a twin
    that would patch what the configuration already patches is left out); words only when split."""
    wanted = [""] + [v for key, v in KEYS.items() if name in list(study.get(key) or [])]
    seen: dict[str, str] = {}
    for v in wanted:
        a = accel_for(name, v)
        words = patch_words(a.patch, a.loss_form)
        if words not in seen.values():
            seen[v] = words
    return list(seen.items()) if len(seen) > 1 else [("", "")]


def expand(plan: Iterable[tuple[str, bool]], study: Mapping) -> list[Planned]:
    """The plan with every split configuration's twins right after each of its runs."""
    return [Planned(m, c, v, w) for m, c in plan for v, w in variants(study, m)]


def study_plan(cfg: DictConfig) -> list[Planned]:
    """(accel config, compiled, variant, patch) in run order: the reference first (every other run is
    compared with it), the baseline next, then the rest, then the compiled runs (the slow compiles
    last); each configuration of study.loss_split / study.linear_loss followed by its twins."""
    names = list(cfg.study.methods) if cfg.study.methods is not None else default_methods(cfg.model.family)
    first = [n for n in (cfg.study.reference, cfg.study.baseline) if n]
    order = list(dict.fromkeys([n for n in first if n in names or n == cfg.study.reference] + names))
    plan = [(m, False) for m in order] + [(m, True) for m in cfg.study.compiled]
    return expand(plan, cfg.study)


@dataclass
class Point:
    label: str  # "" outside a sweep
    slug: str  # its run directory ("" outside a sweep)
    values: dict = field(default_factory=dict)
    cfg: DictConfig = None


def sweep_points(cfg: DictConfig) -> list[Point]:
    """The configurations a study runs: one, or one per swept context / model."""
    s = cfg.study
    if s.sweep is None:
        return [Point("", "", {}, cfg)]
    points = []
    if s.sweep == "context":
        tokens = s.tokens_per_step or int(cfg.data.batch_size) * int(cfg.data.seq_len or cfg.model.context)
        for T in s.contexts:
            c = copy.deepcopy(cfg)
            with open_dict(c):
                c.model.context, c.data.seq_len, c.data.batch_size = int(T), None, int(tokens // T)
            points.append(Point(f"T={T} batch {tokens // T}", f"T{T}", {"context": int(T),
                                                                      "batch_size": int(tokens // T)}, c))
    else:
        for name in s.models:
            loaded = OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml")
            c = copy.deepcopy(cfg)
            with open_dict(c):
                c.model = OmegaConf.merge(c.model, loaded.model)
                if "data" in loaded and "batch_size" in loaded.data:
                    c.data.batch_size = loaded.data.batch_size
            points.append(Point(name, name, {"model": name, "context": int(c.model.context),
                                             "batch_size": int(c.data.batch_size)}, c))
    return points
