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

Each point's config: a model sweep's composed as ``model=<name>`` would compose it (``with_model``), and a
GPT given the study's vocabulary where its config leaves none (``with_study_vocab``, ``study.vocab_size``).
A compiled row takes the loss fallback its configuration declares (``accel_for``, harness.fallback).

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
from harness.config import CONF_DIR, AccelConfig, DataConfig, ModelConfig, accel_names, group_options, patch_words
from harness.fallback import as_compiled, fallback_note

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


def accel_for(name: str, variant: str = "", compiled: bool = False) -> DictConfig:
    """The accel configuration ``name``, every key filled in, as its ``variant`` runs (``compiled``: with the
    whole model compiled, its declared loss fallback taken: harness.fallback)."""
    a = OmegaConf.merge(OmegaConf.structured(AccelConfig), accel_config(name), VARIANTS[variant])
    return as_compiled(a, compiled)


def fallback(name: str, variant: str = "", compiled: bool = False) -> str:
    """What the row of ``name`` (``variant``, ``compiled``) runs instead of its configuration's loss method,
    and why ('' where it runs the configuration as it is)."""
    return fallback_note(accel_for(name, variant), compiled)


def unavailable(name: str, variant: str = "", compiled: bool = False) -> Optional[str]:
    """Why the accel configuration ``name`` (as its ``variant`` runs, ``compiled`` or not) cannot run here
    (None: it can)."""
    a = accel_for(name, variant, compiled)
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
    """The configurations a study runs: one, or one per swept context / model, each with the study's
    vocabulary where its model takes it (:func:`with_study_vocab`)."""
    s = cfg.study
    if s.sweep is None:
        return [Point("", "", {}, with_study_vocab(cfg))]
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
            c = with_model(cfg, name)
            points.append(Point(name, name, {"model": name, "context": int(c.model.context),
                                             "batch_size": int(c.data.batch_size)}, c))
    for p in points:
        p.cfg = with_study_vocab(p.cfg)
    return points


def _model_file(name: str) -> DictConfig:
    path = Path(CONF_DIR) / "model" / f"{name}.yaml"
    return OmegaConf.load(path) if path.is_file() else OmegaConf.create({})


def with_model(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` with the model config ``name`` (conf/model/) in place of its own, as ``model=<name>`` composes
    it: its model and data keys merged in, and the keys that the file of ``cfg``'s own model set and this
    one does not put back to the schema's (a Llama's family, key/value heads, vocabulary and tokenizer do
    not carry over to a GPT); a key set otherwise (on the command line) is kept."""
    old, new = _model_file(str(cfg.model.name)), _model_file(name)
    c = copy.deepcopy(cfg)
    with open_dict(c):
        for group, schema in (("model", ModelConfig), ("data", DataConfig)):
            default = OmegaConf.structured(schema)
            given_old = OmegaConf.to_container(old.get(group) or OmegaConf.create({}), resolve=False)
            given_new = OmegaConf.to_container(new.get(group) or OmegaConf.create({}), resolve=False)
            here = OmegaConf.to_container(c[group], resolve=False)
            for key, value in given_old.items():
                if key not in given_new and here.get(key) == value:
                    c[group][key] = default[key]
            c[group] = OmegaConf.merge(c[group], new.get(group) or OmegaConf.create({}))
    return c


def with_study_vocab(cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``study.vocab_size`` as the vocabulary of a GPT whose config leaves ``model.vocab_size``
    null (the GPT configs on byte data: the LM head and the loss cost what they cost in the real model);
    ``cfg`` itself otherwise: a Llama-family config's vocabulary is its own, and its tokenizer's."""
    vocab = cfg.study.get("vocab_size") if "study" in cfg else None
    if vocab is None or cfg.model.vocab_size is not None or cfg.model.family != "gpt":
        return cfg
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.model.vocab_size = int(vocab)
    return c
