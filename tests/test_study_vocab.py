"""The study's vocabulary and its model sweep (harness.study.plan): ``study.vocab_size`` (50304) goes to a
GPT whose config leaves ``model.vocab_size`` null, never to a Llama-family config (its own vocabulary
and its BPE's) nor to another family; ``study.sweep=model`` composes each point as ``model=<name>`` would,
so a Llama point brings its family, key/value heads, vocabulary and tokenizer and a GPT point none of
them. Composed only: no model is built or trained."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.config import validate
from harness.study import plan
from harness.study.checks import validate_study
from harness.study.run import open_study
from tests import study_methods as sm


@pytest.fixture(autouse=True)
def _no_memory_check(monkeypatch):
    # full-size models' configs checked on a CPU: whether their steps fit this machine is not what these
    # tests judge (the refusal of a reference that cannot fit: tests/test_study.py)
    monkeypatch.setenv("HARNESS_SKIP_MEMORY_CHECK", "1")


def _point(*overrides: str):
    cfg = sm.study_cfg(*overrides, quick=False)
    validate_study(cfg)
    point, = plan.sweep_points(cfg)
    return point.cfg


def test_the_gpt_study_gets_the_studys_vocabulary_unless_told_otherwise():
    assert _point().model.vocab_size == 50304  # gpt2s on bytes: the LM head of the real model
    assert _point("study.vocab_size=null").model.vocab_size is None  # the data's (256 bytes)
    assert _point("model.vocab_size=1000").model.vocab_size == 1000
    assert _point("model=tiny").model.vocab_size == 50304


@pytest.mark.parametrize("name,vocab", [("smollm2_135m", 49152), ("qwen25_05b", 151936), ("llama32_1b", 128256),
                                        ("llama_tiny", 512)])
def test_a_llama_family_study_keeps_its_own_vocabulary(name, vocab):
    c = _point(f"model={name}")  # python -m harness.study model=<name>, composed
    assert (c.model.family, c.model.vocab_size, c.data.tokenizer, c.data.vocab_size) == ("llama", vocab, "bpe", vocab)


def test_the_study_vocabulary_is_for_the_gpt_family_alone():
    other = OmegaConf.create({"model": {"family": "hf", "vocab_size": None}, "study": {"vocab_size": 50304}})
    assert plan.with_study_vocab(other) is other


def test_the_report_states_the_vocabulary_the_runs_have(tmp_path):
    assert open_study(sm.study_cfg(quick=False), tmp_path).cfg.model.vocab_size == 50304


def _sweep(*overrides: str) -> dict:
    cfg = sm.study_cfg("study.sweep=model", *overrides, quick=False)
    validate_study(cfg)  # (each point checked as it runs)
    points = {p.label: p.cfg for p in plan.sweep_points(cfg)}
    for c in points.values():
        validate(c)
    return points


def test_a_model_sweep_brings_each_models_family_vocabulary_and_tokenizer():
    p = _sweep("study.models=[llama_tiny,tiny]", "model.dropout=0.1")
    llama, gpt = p["llama_tiny"], p["tiny"]
    assert (llama.model.family, llama.model.n_kv_head, llama.model.mlp_hidden) == ("llama", 2, 192)
    assert (llama.model.vocab_size, llama.data.tokenizer, llama.data.vocab_size) == (512, "bpe", 512)
    assert (gpt.model.family, gpt.model.vocab_size, gpt.data.tokenizer) == ("gpt", 50304, "bytes")
    assert llama.model.dropout == gpt.model.dropout == 0.1  # the command line's key, kept at every point
    assert (llama.data.batch_size, gpt.data.batch_size) == (8, 8)


def test_a_model_sweep_from_a_llama_model_leaves_nothing_of_it_in_a_gpt_point():
    p = _sweep("model=smollm2_135m", "study.models=[tiny,llama_tiny]")
    gpt = p["tiny"]
    assert gpt.model.family == "gpt" and gpt.model.n_kv_head is None and gpt.model.mlp_hidden is None
    assert gpt.model.rope_theta is None and gpt.model.tied is None
    assert (gpt.model.vocab_size, gpt.data.tokenizer, gpt.data.vocab_size) == (50304, "bytes", None)
    assert (p["llama_tiny"].model.vocab_size, p["llama_tiny"].data.vocab_size) == (512, 512)
