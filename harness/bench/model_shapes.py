"""The shapes a model config (``conf/model/<name>.yaml``) gives the benchmark tables (``--models``).

Each file is read with OmegaConf over the schema's defaults (:class:`harness.config.ModelConfig` and
:class:`harness.config.DataConfig`), as ``model=<name>`` would compose it, without the rest of a run's
config: the attention's query and key/value heads (a GPT's n_kv_head is its n_head), its head
dimension n_embd / n_head, the sequence (the model's context) and the batch of one step
(``data.batch_size`` sequences: the step's tokens are batch x context); the loss's hidden size
(n_embd) and vocabulary.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from omegaconf import OmegaConf

from harness.bench.common import parse_names
from harness.config import CONF_DIR, DataConfig, ModelConfig, group_options


@dataclass(frozen=True)
class ModelShape:
    """One model config's shapes: attention (batch, n_head, n_kv_head, context, head_dim), loss (tokens,
    n_embd, vocab; vocab None where the config leaves it to the data, as the GPT configs do)."""

    name: str
    batch: int
    n_head: int
    n_kv_head: int
    context: int
    head_dim: int
    n_embd: int
    vocab: Optional[int]

    @property
    def tokens(self) -> int:
        """The tokens of one step: batch x context."""
        return self.batch * self.context

    @property
    def attention(self) -> tuple[int, int, int, int, int]:
        """(B, H, Hkv, T, d) of the attention bench."""
        return (self.batch, self.n_head, self.n_kv_head, self.context, self.head_dim)


def model_shape(name: str, conf_dir: Optional[str] = None) -> ModelShape:
    """The shapes of the model config ``name``; an unknown name, or heads that do not divide the width
    or each other, raise a ValueError that says what was wrong and what is accepted."""
    conf_dir = conf_dir or CONF_DIR
    known = group_options("model", conf_dir)
    if name not in known:
        raise ValueError(f"unknown model {name!r}: the model configs (conf/model/) are {', '.join(known)}")
    path = Path(conf_dir) / "model" / f"{name}.yaml"
    schema = OmegaConf.create({"model": OmegaConf.structured(ModelConfig), "data": OmegaConf.structured(DataConfig)})
    cfg = OmegaConf.merge(schema, OmegaConf.load(path))
    m, batch = cfg.model, int(cfg.data.batch_size)
    if m.hf.shapes_from_config:
        raise ValueError(f"model {name!r} takes its shape from a Hugging Face config given on the command line; "
                         "the benchmarks take the configs that state a shape: " +
                         ", ".join(n for n in known if n != name))
    kv = m.n_head if m.n_kv_head is None else m.n_kv_head
    if m.n_head < 1 or kv < 1 or m.n_head % kv or m.n_embd % m.n_head:
        raise ValueError(f"model {name!r} ({path}): n_head={m.n_head}, n_kv_head={kv}, n_embd={m.n_embd} give no "
                         "attention shape (n_kv_head must divide n_head, and n_head n_embd)")
    return ModelShape(name, batch, int(m.n_head), int(kv), int(m.context), int(m.n_embd // m.n_head), int(m.n_embd),
                      None if m.vocab_size is None else int(m.vocab_size))


def model_shapes(names: list[str], conf_dir: Optional[str] = None) -> list[ModelShape]:
    """:func:`model_shape` of each name, in order."""
    return [model_shape(n, conf_dir) for n in names]


def models_option(a: argparse.Namespace, error: Callable[[str], None], instead: dict) -> Optional[list[ModelShape]]:
    """The shapes of a table's ``--models`` (None where it is not given); ``error`` (the parser's) where it is
    given beside one of ``instead`` (flag -> its value, None when not given: the options --models replaces),
    names nothing, or names an unknown model or one without a shape."""
    names_arg = getattr(a, "models", None)  # (None also in a namespace built without --models)
    if names_arg is None:
        return None
    given = [flag for flag, value in instead.items() if value is not None]
    if given:
        error(f"--models and {', '.join(given)} are both given: --models runs each model's shapes instead of "
              f"{', '.join(instead)}; give one or the other")
    names = parse_names(names_arg)
    if not names:
        error(f"--models takes comma-separated model configs of conf/model/ (got {names_arg!r})")
    try:
        return model_shapes(names)
    except ValueError as exc:
        error(f"--models: {exc}")
