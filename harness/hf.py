"""``model.family=hf``: a Hugging Face causal LM built from ``model.hf``, checked before any work.

``model.hf.config`` is a mapping (``model_type`` plus the config's keys, written in the YAML: the
configs in ``conf/model/hf_*.yaml`` take the shape keys from ``model.n_layer`` etc.), or the path of a
``config.json`` or of a directory holding one: built with ``AutoModelForCausalLM.from_config`` (random
weights, nothing downloaded). ``model.hf.path`` is a local checkpoint directory, loaded with local files
only. The vocabulary: ``model.vocab_size`` where set (not with a checkpoint, whose weights fix it),
else the one the HF config states, else the data's.

Refused before any work (:func:`hf_problem`, for ``harness.config.validate``), naming what was wrong
and what is accepted: transformers not installed, neither or both of ``model.hf.config`` and
``model.hf.path``, a missing path, an unknown ``model_type``, a model that is not a causal LM, a
vocabulary smaller than the data's, and a harness shape key (``model.n_layer``, ``n_head``,
``n_kv_head``, ``n_embd``, ``mlp_hidden``, ``dropout``: what the memory estimate, the report and the
study read) that disagrees with the HF config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from harness.data import data_vocab_size
from models.hf import HFCausalLM, TransformersMissingError, hf_shapes, load_transformers

Problem = Optional[tuple[str, Any, str]]


class HFConfigError(ValueError):
    """A ``model.hf`` that cannot be built (the message names the key, the value and what is accepted)."""

    def __init__(self, key: str, value: Any, accepted: str):
        super().__init__(f"config value {key}={value!r} is not accepted: {accepted}")
        self.problem = (key, value, accepted)


def _shown(spec) -> dict:
    """``model.hf`` as plain values, for a message."""
    raw = spec.config
    return {"config": OmegaConf.to_container(raw) if isinstance(raw, DictConfig) else raw, "path": spec.path}


def causal_lm_types() -> list[str]:
    """The model types transformers builds as a causal LM (``AutoModelForCausalLM``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # (after load_transformers)

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _from_mapping(tf, overrides: dict, key: str):
    """A config from ``model_type`` plus its keys."""
    overrides = dict(overrides)
    model_type = overrides.pop("model_type", None)
    if model_type is None:
        raise HFConfigError(f"{key}.model_type", None, "a transformers model type (llama, qwen2, gpt2, ...) beside the "
                            "config's keys, or a path to a config.json as model.hf.config")
    if model_type not in causal_lm_types():
        raise HFConfigError(f"{key}.model_type", model_type,
                            f"a transformers causal-LM model type, one of: {', '.join(causal_lm_types())}")
    return tf.AutoConfig.for_model(model_type, **overrides)


def _config_file(path_value: str) -> dict:
    """The keys of a config.json given as itself or as its directory."""
    path = Path(path_value).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise HFConfigError("model.hf.config", path_value, "a mapping (model_type plus keys), a config.json, or a "
                            "directory holding one (no such file: " + str(file) + ")")
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise HFConfigError("model.hf.config", path_value, f"a readable JSON config.json ({exc})") from exc


def hf_config(m: DictConfig, data_vocab: Optional[int] = None):
    """The transformers config ``model`` (the ``model`` node of a run's config) describes, its vocabulary
    set (``data_vocab``: the data's, for a config that states none)."""
    tf = load_transformers()
    spec = m.hf
    if (spec.config is None) == (spec.path is None):
        raise HFConfigError("model.hf", _shown(spec), "exactly one of model.hf.config (a model_type "
                            "plus keys, or a config.json: random weights) and model.hf.path (a local checkpoint)")
    if spec.path is not None:
        path = Path(str(spec.path)).expanduser()
        if not (path / "config.json").is_file():
            raise HFConfigError("model.hf.path", spec.path, "a local checkpoint directory holding a config.json "
                                "(loaded with local files only: nothing is downloaded)")
        config = tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
        if m.vocab_size is not None and int(m.vocab_size) != config.vocab_size:
            raise HFConfigError("model.vocab_size", m.vocab_size, f"null or {config.vocab_size}: the checkpoint's "
                                "weights fix its vocabulary")
        stated = True
    else:
        raw = spec.config
        keys = (_config_file(raw) if isinstance(raw, str) else
                OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else dict(raw))
        config = _from_mapping(tf, keys, "model.hf.config")
        stated = "vocab_size" in keys
        if m.vocab_size is not None:
            config.vocab_size = int(m.vocab_size)
        elif not stated and data_vocab is not None:
            config.vocab_size = int(data_vocab)
    if config.model_type not in causal_lm_types():  # (a path's config.json may be of any model)
        raise HFConfigError("model.hf", config.model_type, f"a causal LM's config: transformers builds no causal LM of "
                            f"model_type {config.model_type!r}; accepted: {', '.join(causal_lm_types())}")
    return config


def build_hf_model(cfg: DictConfig) -> HFCausalLM:
    """The model ``cfg`` describes: random weights from the config, or the checkpoint's."""
    tf = load_transformers()
    m = cfg.model
    config = hf_config(m, data_vocab_size(cfg.data))
    if m.hf.path is not None:
        # use_kernels=False: from_pretrained would otherwise swap layers for Hugging Face hub kernels (downloads)
        hf = tf.AutoModelForCausalLM.from_pretrained(str(Path(str(m.hf.path)).expanduser()), local_files_only=True,
                                                     dtype=torch.float32, use_kernels=False)
    else:
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return HFCausalLM(hf, int(m.context))


def hf_problem(c) -> Problem:
    """The first ``model.hf`` problem of a run's config (key, value, what is accepted), None when the model
    can be built: the HF config is resolved (transformers imported, no weights)."""
    m = c.model
    try:
        data_vocab = data_vocab_size(c.data)
        config = hf_config(m, data_vocab)
    except TransformersMissingError as exc:
        return "model.family", m.family, str(exc)
    except HFConfigError as exc:
        return exc.problem
    except (OSError, ValueError, TypeError) as exc:  # transformers' own word on a config it cannot read
        return "model.hf", _shown(m.hf), f"a config transformers can read ({exc})"
    if config.vocab_size < data_vocab:
        return ("model.vocab_size", config.vocab_size, f"at least the data's vocabulary ({data_vocab} tokens): the "
                "model's embedding must hold every token id")
    shapes = hf_shapes(config, int(m.context))
    want = {"n_layer": shapes.n_layer, "n_head": shapes.n_head, "n_embd": shapes.n_embd,
            "n_kv_head": shapes.n_kv_head, "mlp_hidden": shapes.mlp_hidden, "dropout": shapes.dropout}
    if m.hf.shapes_from_config:  # (model=hf) the harness's shape keys are the HF config's, whatever they held
        for key, value in want.items():
            setattr(m, key, float(value) if key == "dropout" else int(value))
        if m.vocab_size is None:  # (the config's, as the build takes it: the report and the estimate read it)
            m.vocab_size = int(config.vocab_size)
        return None
    for key, value in want.items():
        have = getattr(m, key)
        if key in ("n_kv_head", "mlp_hidden") and have is None:
            continue
        if (abs(float(have) - value) > 1e-12) if key == "dropout" else int(have) != value:
            return (f"model.{key}", have, f"{value}, what the HF config says (the memory estimate, the report and the "
                    "study read this key; change the shape in model.hf.config, or set both)")
    return None
