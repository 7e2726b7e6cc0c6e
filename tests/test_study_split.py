"""A study's rows per softmax (harness.study.plan / checks / ratios / labels, study.loss_split and study.linear_loss): the plan
puts each twin after its configuration, a tiny study writes the rows with what they patched and the
ratio table, the gate judges every row on its own, repeats pair the ratios by round, and a bad key
value is refused before any training."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import kernels
from harness.config import CONF_DIR, ConfigError
from harness.help import help_text
from harness.study.checks import validate_study
from harness.study.plan import study_plan
from harness.study.run import run_study
from tests import study_methods as sm
from tests.test_study import SHORT, read_csv
from tests.test_train import run_cli

WRONG_LOSS = "_test_wrong_loss"


@pytest.fixture
def wrong_loss(monkeypatch):
    """A correct softmax with a cross-entropy 1% too high: only the loss row may fail the gate."""
    from harness.study import plan as study_mod

    def ce(logits, targets, ignore_index, reduction):
        return 1.01 * F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction=reduction)

    m = kernels.Method(WRONG_LOSS, softmax=kernels.get_method("torch").softmax, cross_entropy=ce,
                       summary="test: a cross-entropy 1% off")
    kernels.register(m)
    real, names = study_mod.accel_config, study_mod.accel_names
    monkeypatch.setattr(study_mod, "accel_config", lambda name: (
        OmegaConf.create({"name": name, "method": name}) if name == WRONG_LOSS else real(name)))
    monkeypatch.setattr(study_mod, "accel_names", lambda: names() + [WRONG_LOSS])
    yield WRONG_LOSS
    kernels.unregister(WRONG_LOSS)


def test_the_plan_puts_each_twin_after_every_run_of_its_configuration():
    cfg = sm.study_cfg("study.methods=[torch,naive,triton,sdpa]", "study.compiled=[triton,naive]",
                       "study.loss_split=[triton,cuda]", "study.linear_loss=[triton]")
    plan = [(p.method, p.compiled, p.variant, p.patch) for p in study_plan(cfg)]
    assert plan == [
        ("torch", False, "", ""), ("naive", False, "", ""),
        ("triton", False, "", "attention + loss"), ("triton", False, "attention", "attention"),
        ("triton", False, "linear", "attention + linear loss"),
        ("sdpa", False, "", ""),
        ("triton", True, "", "attention + loss"), ("triton", True, "attention", "attention"),
        ("triton", True, "linear", "attention + linear loss"),
        ("naive", True, "", ""),
    ]  # cuda is listed but not in the study: it adds nothing
    quiet = sm.study_cfg("study.methods=[torch,naive]")  # the default loss_split names methods not in it
    assert [p.patch for p in study_plan(quiet)] == ["", ""]


def test_a_tiny_study_writes_the_rows_with_what_they_patched(tmp_path):
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,naive]", "study.loss_split=[naive]",
                       "study.linear_loss=[naive]", "study.parity_tol=0.05", "logger=csv")
    rows = run_study(cfg, tmp_path)
    by = {r.label: r for r in rows}
    assert list(by) == ["torch", "naive: attention + loss", "naive: attention", "naive: attention + linear loss"]
    assert all(r.status in ("PASS", "REFERENCE") for r in rows)
    assert by["naive: attention + loss"].patched["loss"] == "native"
    assert by["naive: attention"].patched["attention"] == "composed" and by["naive: attention"].patched["loss"] is None
    linear = by["naive: attention + linear loss"].patched
    assert linear["loss_form"] == "linear" and linear["loss"] == "composed"
    assert by["torch"].speedup_vs_reference == 1.0 and by["naive: attention"].speedup_vs_reference  # judged alike
    assert by["naive: attention + loss"].vs_attention and by["naive: attention"].vs_attention is None
    run = json.loads((tmp_path / "runs" / "naive-attention" / "results.json").read_text())
    assert run["config"]["accel"]["patch"] == ["attention"] and run["method"] == "naive"
    csv_rows = read_csv(tmp_path / "results.csv")
    assert [(r["patch"], r["patched"]) for r in csv_rows] == [
        ("", "attention (composed) + loss (native)"), ("attention + loss", "attention (composed) + loss (native)"),
        ("attention", "attention (composed)"),
        ("attention + linear loss", "attention (composed) + linear loss (composed)")]
    assert float(csv_rows[1]["vs_attention"]) > 0 and csv_rows[2]["vs_attention"] == ""
    assert {r["patch"] for r in read_csv(tmp_path / "runs.csv")} == {"", "attention + loss", "attention",
                                                                    "attention + linear loss"}
    saved = json.loads((tmp_path / "study.json").read_text())["rows"]
    assert [r["variant"] for r in saved] == ["", "", "attention", "linear"]
    report = (tmp_path / "report.md").read_text()
    assert "## What the loss kernel adds" in report
    assert "| naive: attention + loss vs naive: attention | attention (composed) + loss (native) |" in report
    assert "| naive: attention + linear loss vs naive: attention |" in report
    # the report over the same runs reads the rows back apart, with their labels and ratios
    from harness.study.from_runs import build_report

    again = {r.label: r for r in build_report(tmp_path, tmp_path.parent / "again")}
    assert set(again) >= {"naive: attention + loss", "naive: attention", "naive: attention + linear loss"}
    assert again["naive: attention"].repeats == 1 and again["naive: attention + loss"].vs_attention
    assert "What the loss kernel adds" in (tmp_path.parent / "again" / "report.md").read_text()


def test_the_gate_judges_each_row_on_what_it_patched(tmp_path, wrong_loss):
    cfg = sm.study_cfg(*SHORT, f"study.methods=[torch,{wrong_loss}]", f"study.loss_split=[{wrong_loss}]",
                       "study.parity_tol=0.05")
    by = {r.label: r for r in run_study(cfg, tmp_path)}
    both, alone = by[f"{wrong_loss}: attention + loss"], by[f"{wrong_loss}: attention"]
    assert both.status == "FAIL" and "cross_entropy" in both.reason and both.tokens_per_s is None
    assert alone.status == "PASS" and alone.parity == "pass"  # its loss is the model's own: nothing wrong there
    report = (tmp_path / "report.md").read_text()
    assert f"- ({wrong_loss}: attention + loss: FAIL; {wrong_loss}: attention: PASS)" in report  # no ratio


def test_repeats_pair_the_ratios_by_round(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    calls = []
    tps = {"": [110.0, 120.0, 115.0], "attention": [100.0, 110.0, 104.0]}
    mem = {"": 6.0, "attention": 10.0}

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        calls.append((method, variant))
        i = sum(1 for c in calls if c == (method, variant)) - 1
        curve = [5.0 - 0.1 * s for s in range(10)]
        speed = tps[variant][i] if method == "triton" else 100.0 + i
        patched = {"method": method, "attention": "composed", "loss": None if variant else "native",
                   "loss_form": "logits"}
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": speed, "step_ms_p50": 10.0,
                "step_ms_p90": 10.2, "loss_curve": curve, "final_train_loss": curve[-1], "patched": patched,
                "peak_mem_gib": mem[variant] if method == "triton" else 8.0}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,triton]", "study.loss_split=[triton]", "study.repeats=3",
                       "study.parity_tol=0.01", "study.profile=false")
    rows = run_study(cfg, tmp_path)
    assert calls == [("torch", ""), ("triton", ""), ("triton", "attention")] * 3  # the twin runs in every round
    loss = next(r for r in rows if r.patch == "attention + loss")
    assert loss.vs_attention == pytest.approx(1.1) and loss.vs_attention_lo < 1.1 < loss.vs_attention_hi
    assert loss.vs_attention_lo > 1.0  # 1.100, 1.091, 1.106: paired by round, the interval stays above 1
    assert loss.mem_vs_attention == pytest.approx(0.6)
    report = (tmp_path / "report.md").read_text()
    assert "| triton: attention + loss vs triton: attention |" in report and "1.100x [" in report
    assert "0.600x" in report
    row = next(r for r in read_csv(tmp_path / "results.csv") if r["patch"] == "attention + loss")
    assert float(row["vs_attention_lo"]) > 1.0 and float(row["mem_vs_attention"]) == pytest.approx(0.6)


@pytest.mark.parametrize("override,message", [
    ("study.loss_split=[triton,nope]", "study.loss_split='nope'"),
    ("study.loss_split=[sdpa]", "sdpa cannot: its method 'sdpa' provides attention: no cross_entropy"),
    ("study.linear_loss=[flash]", "study.linear_loss='flash'"),
])
def test_bad_split_keys_are_refused(override, message):
    with pytest.raises(ConfigError, match="not accepted") as e:
        validate_study(sm.study_cfg(override))
    assert message in str(e.value) and "No study was started" in str(e.value)
    if "sdpa" in override:
        assert "Those that can: " in str(e.value) and "triton" in str(e.value).split("Those that can: ")[1]


def test_a_bad_split_fails_fast_on_the_command_line_and_help_lists_the_keys(tmp_path):
    r = run_cli("study.loss_split=[sdpa]", cwd=tmp_path, module="harness.study")
    assert r.returncode == 2 and "study.loss_split='sdpa'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "outputs").exists()  # refused before any directory was made
    text = help_text("study", CONF_DIR, "study")
    assert "study.loss_split=[triton,cuda]" in text and "study.linear_loss=[]" in text



@pytest.mark.slow
def test_a_sweep_runs_the_twins_at_every_point(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    calls = []

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        calls.append((int(cfg.model.context), method, variant))
        curve = [5.0 - 0.1 * s for s in range(6)]
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": 100.0 if variant else 120.0,
                "step_ms_p50": 10.0, "step_ms_p90": 10.2, "loss_curve": curve, "final_train_loss": curve[-1],
                "patched": {"attention": "composed", "loss": None if variant else "native"}}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    cfg = sm.study_cfg("trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3",
                       "study.methods=[torch,triton]", "study.loss_split=[triton]", "study.sweep=context",
                       "study.contexts=[32,64]", "study.tokens_per_step=256", "study.parity_tol=0.05",
                       "study.profile=false")
    rows = run_study(cfg, tmp_path)
    assert calls == [(T, m, v) for T in (32, 64) for m, v in (("torch", ""), ("triton", ""), ("triton", "attention"))]
    assert [r.vs_attention for r in rows if r.patch == "attention + loss"] == [pytest.approx(1.2)] * 2
    report = (tmp_path / "report.md").read_text()
    for point in ("T=32 batch 8", "T=64 batch 4"):
        assert f"| {point}: triton: attention + loss vs triton: attention |" in report
    assert "| triton: attention | 100 | 100 |" in report  # the scaling table has the twin's own line


def test_the_report_keeps_runs_of_one_configuration_with_another_loss_method_apart(tmp_path):
    """harness.report over runs of accel=torch with and without accel.loss_method=naive: two rows, each
    with its own run (they differ in what computed the loss), not one row of two repeats."""
    from harness.study.from_runs import build_report

    model = {"name": "tiny", "n_layer": 2, "n_head": 2, "n_embd": 64, "context": 64, "vocab_size": 256}
    data = {"name": "stdlib", "batch_size": 8, "seq_len": None, "seed": None}
    for slug, loss_method, tps in (("a", None, 100.0), ("b", "naive", 50.0)):
        d = tmp_path / "runs" / slug
        d.mkdir(parents=True)
        accel = {"name": "torch", "method": "torch", "patch": ["attention", "loss"], "loss_form": "logits",
                 "options": {}, "loss_method": loss_method}
        patched = {"method": "torch", "attention": "composed", "loss": "native", "loss_form": "logits",
                   "options": {}, "loss_method": loss_method or "torch"}
        res = {"status": "completed", "method": "torch", "compile_model": False, "model": model, "data": data,
               "seed": 1337, "device": "cpu", "precision": "32", "world_size": 1, "tokens_per_s": tps,
               "step_ms_p50": 10.0, "step_ms_p90": 10.5, "peak_mem_gib": None, "final_train_loss": 5.0,
               "loss_curve": [5.5, 5.0], "run_dir": str(d), "gate": {"checked": True}, "patched": patched,
               "config": {"accel": accel, "model": model, "data": data, "seed": 1337,
                          "trainer": {"max_steps": 2, "warmup_steps": 1}}}
        (d / "results.json").write_text(json.dumps(res))
    rows = build_report(tmp_path, tmp_path.parent / "rep")
    assert sorted((r.repeats, r.tokens_per_s, r.label) for r in rows) == [(1, 50.0, "torch [loss_method=naive]"),
                                                                          (1, 100.0, "torch")]
    assert "| torch [loss_method=naive] |" in (tmp_path.parent / "rep" / "report.md").read_text()


def test_a_configuration_whose_own_loss_is_linear_is_not_its_linear_twin():
    """flash_linear patches attention + linear loss as it is: re-reported, its own row stays the
    configuration (variant ''), its attention-only run the twin."""
    from harness.study.labels import configured, mark_split, own_setting, own_words
    from harness.study.rows import StudyRow

    assert own_words("flash_linear") == "attention + linear loss" and own_words("triton") == "attention + loss"
    assert own_words("no_such_config") == "attention + loss"
    rows = [StudyRow("flash_linear", True, "PASS", patch="attention + linear loss"),
            StudyRow("flash_linear", True, "PASS", patch="attention"),
            StudyRow("triton", False, "PASS", patch="attention + linear loss"),
            StudyRow("triton", False, "PASS", patch="attention + loss")]
    mark_split(rows)
    assert [r.variant for r in rows] == ["", "attention", "linear", ""]
    base = {"config": {"accel": {"name": "sdpa", "method": "sdpa", "options": {"backend": "cudnn"}}}}
    assert configured(base) == "backend=cudnn" and configured({}) == ""
    assert configured({"config": {"accel": {"loss_method": "naive"}}}) == "loss_method=naive"
    assert own_setting("flash_linear") == "loss_method=triton" and own_setting("torch") == ""
    assert own_setting("sdpa_cudnn") == "backend=cudnn"
