"""A training step's memory, estimated before any work: refused above what the device has (exit 2, no
directory), warned above 80% of it; the estimate's parts follow its documented formula."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from harness import memory
from harness.build import build_model, seq_len
from harness.cli import precheck_overrides
from harness.config import CONF_DIR
from harness.memory import GIB, MemoryEstimateError, check_step_memory, step_memory
from harness.train import validate_with_data
from tests.test_train import compose_cfg

TINY = ["model=tiny", "trainer=cpu"]


@pytest.fixture(scope="module")
def tiny():
    return compose_cfg(*TINY)


def _with(cfg, **changes):
    """A copy of ``cfg`` with dotted keys changed (composing afresh costs seconds on a loaded CPU)."""
    out = cfg.copy()
    with open_dict(out):  # (new keys too: accel.options' backend)
        for key, value in changes.items():
            OmegaConf.update(out, key.replace("__", "."), value)
    return out


def test_states_are_16_bytes_a_parameter_of_the_real_model(tiny):
    cfg = tiny
    est = step_memory(cfg, gpu=False)
    assert est.params == sum(p.numel() for p in build_model(cfg).parameters())
    assert est.states == 16 * est.params


def test_the_estimate_follows_batch_precision_and_loss_form(tiny):
    base = step_memory(tiny, gpu=False)
    double = step_memory(_with(tiny, data__batch_size=16), gpu=False)
    assert double.activations == 2 * base.activations and double.logits == 2 * base.logits
    half = step_memory(_with(tiny, trainer__precision="bf16-mixed"), gpu=False)
    assert half.activations * 2 == base.activations  # 16-bit activations
    assert step_memory(_with(tiny, accel__loss_form="linear"), gpu=False).logits == 0
    # quadratic in the context: the attention scores
    short = step_memory(_with(tiny, data__seq_len=64), gpu=False)
    assert 2 * short.activations < base.activations < 4 * short.activations


def test_a_fused_attention_keeps_no_scores_and_a_fused_model_patch_no_logits(tiny):
    b, t, h, layers = tiny.data.batch_size, seq_len(tiny), tiny.model.n_head, tiny.model.n_layer
    scores = layers * 2.5 * h * b * t * t * 4  # fp32 (trainer=cpu)
    composed = step_memory(tiny, gpu=False)  # accel=torch: attention composed from its softmax
    for method in ("sdpa", "flex", "flash"):  # native (fused) attention, available here or not
        fused = step_memory(_with(tiny, accel__method=method), gpu=False)
        assert composed.activations - fused.activations == pytest.approx(scores, abs=1)
    math = _with(tiny, accel__method="sdpa", accel__options={"backend": "math"})
    assert step_memory(math, gpu=False).activations == composed.activations  # SDPA's math path keeps them
    assert step_memory(_with(tiny, accel__method="flash", accel__patch=["loss"]), gpu=False).activations == \
        composed.activations  # attention not patched: the model's own keeps them
    assert composed.logits > 0
    unpatched_loss = _with(tiny, accel__method="flash", accel__patch=["attention"], accel__loss_form="linear")
    assert step_memory(unpatched_loss, gpu=False).logits == composed.logits  # the model's own loss: logits
    dropout = _with(tiny, accel__method="sdpa", model__dropout=0.1)  # SDPA on a CPU drops out on its math path
    assert step_memory(dropout, gpu=False).activations == composed.activations
    grouped = compose_cfg(*TINY, "model=llama_tiny")
    sdpa_gpu32 = _with(grouped, accel__method="sdpa")  # a GPU in fp32 with grouped heads: no fused backend takes it
    assert step_memory(sdpa_gpu32, gpu=True).activations == step_memory(grouped, gpu=True).activations
    assert step_memory(_with(sdpa_gpu32, trainer__precision="bf16-mixed"), gpu=True).activations < \
        step_memory(_with(grouped, trainer__precision="bf16-mixed"), gpu=True).activations
    liger = _with(tiny, accel__model_patch="liger")
    assert step_memory(liger, gpu=False).logits == 0  # Liger's fused linear cross-entropy, by its default
    no_flce = _with(tiny, accel__model_patch="liger", accel__model_patch_options={"fused_linear_cross_entropy": False})
    assert step_memory(no_flce, gpu=False).logits == composed.logits


def test_gpt2s_on_a_machine_with_16_gib_is_refused_with_what_to_change():
    cfg = compose_cfg("model=gpt2s", "trainer=cpu")
    with pytest.raises(MemoryEstimateError) as e:
        check_step_memory(cfg, gpu=False, available=16 * GIB)
    msg = str(e.value)
    assert "model=gpt2s" in msg and "16.0 GiB is of RAM available" in msg and "needs about" in msg
    assert "smaller data.batch_size" in msg
    est = step_memory(cfg, gpu=False).total
    assert f"{est / GIB:.1f} GiB" in msg and est > 16 * GIB


def test_near_the_limit_warns_and_well_below_says_nothing(tiny):
    cfg = tiny
    est = step_memory(cfg, gpu=False).total
    assert "may run out of memory" in check_step_memory(cfg, gpu=False, available=int(est / 0.9))
    assert check_step_memory(cfg, gpu=False, available=est * 10) is None
    big_vocab = _with(tiny, model__vocab_size=50304)
    with pytest.raises(MemoryEstimateError, match="accel.loss_form=linear"):  # the logits are most of it
        check_step_memory(big_vocab, gpu=False, available=step_memory(big_vocab, gpu=False).total // 2)


def test_the_command_line_refuses_before_any_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_memory", lambda gpu: 1 * GIB)
    with pytest.raises(SystemExit) as e:
        precheck_overrides(["model=gpt2s", "trainer=cpu"], CONF_DIR, "config", validate=validate_with_data)
    assert e.value.code == 2 and "it would run out of memory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_available_memory_of_this_cpu_is_a_positive_number():
    got = memory.available_memory(gpu=False)
    assert got is None or got > 0
