"""accel.loss_method: one accel configuration whose loss comes from another method than its attention
(conf/accel/flash_linear.yaml: flash attention + Triton's fused linear cross-entropy), through the
config, the CLI listing, the gate, the study's plan and its attention-only twin."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import kernels
from harness import gate
from harness.accel import AccelError, Applied
from harness.build import accel_applied
from harness.availability import accel_choices, accel_unavailable
from harness.config import CONF_DIR, AccelConfig, accel_methods, validate
from harness.help import help_text
from harness.study.checks import _misfit, validate_study
from harness.study.labels import patched_words
from harness.study.plan import VARIANTS, accel_for, study_plan
from models import GPT, GPTConfig
from tests import study_methods as sm

CFG = GPTConfig(vocab_size=97, context=24, n_layer=2, n_head=2, n_embd=32)


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_accel_flash_linear_composes_through_hydra():
    cfg = compose_cfg("accel=flash_linear", "model=tiny", "trainer=cpu")
    a = cfg.accel
    assert (a.name, a.method, a.loss_method, a.loss_form) == ("flash_linear", "flash", "triton", "linear")
    assert list(a.patch) == ["attention", "loss"] and dict(a.options) == {}
    validate(cfg)
    assert compose_cfg("accel=torch").accel.loss_method is None  # the default: the loss from accel.method
    assert compose_cfg("accel=torch", "accel.loss_method=naive").accel.loss_method == "naive"


def test_accel_configs_with_a_loss_method_build_from_the_config():
    cfg = OmegaConf.create({"accel": OmegaConf.merge(OmegaConf.structured(AccelConfig),
                                                     {"name": "x", "method": "sdpa", "loss_method": "naive"})})
    applied = accel_applied(GPT(CFG), cfg)
    assert (applied.attention, applied.loss, applied.loss_from) == ("native", "native", "naive")
    # the study's attention-only twin drops the loss method: no error, the loss stays eager
    cfg.accel = OmegaConf.merge(cfg.accel, VARIANTS["attention"])
    assert cfg.accel.loss_method is None and list(cfg.accel.patch) == ["attention"]
    applied = accel_applied(GPT(CFG), cfg)
    assert applied.attention == "native" and applied.loss is None and applied.as_dict()["loss_method"] is None
    # asked for by hand instead, the same combination is refused, saying why
    cfg.accel.loss_method = "naive"
    with pytest.raises(AccelError, match="does not patch the loss"):
        accel_applied(GPT(CFG), cfg)


def test_accel_methods_lists_the_loss_method_only_where_it_computes_the_loss():
    assert accel_methods("flash", "triton") == [("flash", {}), ("triton", {})]
    assert accel_methods("sdpa", "naive", {"backend": "math"}) == [("sdpa", {"backend": "math"}), ("naive", {})]
    assert accel_methods("triton", None) == [("triton", {})]
    assert accel_methods("triton", "triton") == [("triton", {})]
    assert accel_methods("flash", "triton", patch=["attention"]) == [("flash", {})]


def test_accel_cli_listing_shows_flash_linear_and_checks_the_loss_method():
    choices = {c["name"]: c for c in accel_choices()}
    fl = choices["flash_linear"]
    assert fl["method"] == "flash" and fl["loss_method"] == "triton"
    assert fl["available"] == all(m in kernels.runnable_methods() for m in ("flash", "triton"))
    assert "flash_linear" in help_text("train", CONF_DIR, "config")
    off = kernels.Method(name="_test_off", cross_entropy=kernels.get_method("torch").cross_entropy, summary="test",
                         unavailable_reason=lambda: "test: never here")
    kernels.register(off)
    try:
        assert accel_unavailable("torch", {}, "_test_off") == "its loss_method '_test_off': test: never here"
        assert accel_unavailable("torch", {}, "_test_off", ["attention"]) is None  # the loss is not patched
        assert "unknown method 'nope'" in accel_unavailable("torch", {}, "nope")
    finally:
        kernels.unregister(off.name)


def test_accel_gate_checks_the_loss_against_its_own_method():
    shapes = gate.RunShapes(heads=2, seq_len=16, head_dim=16, vocab=64, n_embd=32, tokens=64,
                            dtype=torch.float32, device="cpu")
    info = gate.run_gate(Applied("sdpa", attention="native", loss="native", loss_method="naive"), shapes)
    assert info["checked"] and [(c["method"], c["op"]) for c in info["checks"]] == [
        ("sdpa", "attention"), ("naive", "cross_entropy")]
    floor = Applied("floor", attention="composed", loss="native", loss_method="torch")  # timing-only attention
    info = gate.run_gate(floor, shapes)
    assert [(c["method"], c["op"]) for c in info["checks"]] == [("torch", "cross_entropy")]
    assert "timing-only" in info["unchecked"]["attention"]
    wrong = kernels.Method(name="_test_wrong_ce", summary="test",
                           cross_entropy=lambda lg, t, ii, red: 1.01 * torch.nn.functional.cross_entropy(
                               lg.float(), t, ignore_index=ii, reduction=red))
    kernels.register(wrong)
    try:
        with pytest.raises(gate.GateError, match="method '_test_wrong_ce' failed its cross_entropy check"):
            gate.run_gate(Applied("torch", attention="composed", loss="native", loss_method=wrong.name), shapes)
    finally:
        kernels.unregister(wrong.name)


def test_accel_flash_linear_in_a_study_plan_and_its_twins():
    registered = {n: a.ops for n, a in kernels.available_methods(include_timing_only=True).items()}
    fl = accel_for("flash_linear")
    assert _misfit(fl, "attention", registered) is None  # flash: attention; triton: linear_cross_entropy
    assert "not the loss on the logits" in _misfit(fl, "linear", registered)
    bad = OmegaConf.merge(fl, {"loss_method": "sdpa"})
    assert _misfit(bad, "attention", registered) == "its loss_method 'sdpa' provides attention: no linear_cross_entropy"
    cfg = sm.study_cfg("study.methods=[torch,naive,flash_linear]", "study.loss_split=[flash_linear]")
    validate_study(cfg)  # the precheck takes it: its loss method provides the loss
    plan = [(p.method, p.variant, p.patch) for p in study_plan(cfg)]
    assert plan[2:] == [("flash_linear", "", "attention + linear loss"), ("flash_linear", "attention", "attention")]
    twin = accel_for("flash_linear", "attention")
    assert twin.loss_method is None and twin.method == "flash"


def test_accel_patched_words_name_a_different_loss_method():
    rec = {"method": "flash", "attention": "native", "loss": "native", "loss_form": "linear", "loss_method": "triton"}
    assert patched_words(rec) == "attention (native) + linear loss (native, triton)"
    assert patched_words({**rec, "loss_method": "flash"}) == "attention (native) + linear loss (native)"
    old = {k: v for k, v in rec.items() if k != "loss_method"}  # results written before the key existed
    assert patched_words(old) == "attention (native) + linear loss (native)"
    assert patched_words({**rec, "attention_qkv": True}) == "attention (native, qkv) + linear loss (native, triton)"


def test_flash_linear_split_is_flash_linear_without_attention_qkv():
    """conf/accel/flash_linear_split.yaml: what a study puts beside flash_linear to show what attention_qkv buys."""
    from harness.build import accel_applied
    from models import GPT, GPTConfig

    fl, split = accel_for("flash_linear"), accel_for("flash_linear_split")
    assert fl.qkv and not split.qkv
    assert {k: v for k, v in split.items() if k not in ("name", "qkv")} == {k: v for k, v in fl.items()
                                                                             if k not in ("name", "qkv")}
    cfg = OmegaConf.create({"accel": split})
    applied = accel_applied(GPT(GPTConfig(vocab_size=64, context=8, n_layer=1, n_head=2, n_embd=16)), cfg)
    assert applied.attention == "native" and not applied.attention_qkv


@pytest.mark.slow
def test_accel_profile_of_the_attention_twin_names_the_eager_loss():
    from harness.breakdown import profile_step

    cfg = sm.study_cfg()
    accel = OmegaConf.merge(OmegaConf.structured(AccelConfig),
                            {"name": "x", "method": "torch", "loss_method": "naive", "loss_form": "linear"})
    assert profile_step(cfg, accel).parts["loss"].name == "loss (LM head + cross-entropy)"
    twin = OmegaConf.merge(accel, VARIANTS["attention"])  # the loss stays the model's eager one, on the logits
    assert profile_step(cfg, twin).parts["loss"].name == "loss (cross-entropy)"
