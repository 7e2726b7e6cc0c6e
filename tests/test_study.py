"""The speedup study on the CPU with the tiny model: report, CSV and charts; a wrong method is caught."""

from __future__ import annotations

import csv

import pytest
import torch
from hydra import compose, initialize_config_dir

import kernels
from harness.config import CONF_DIR
from harness.study import run_study
from harness.study_report import parity


def study_cfg(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="study", overrides=[
            "model=tiny", "data=stdlib", "trainer=cpu", "trainer.max_steps=12", "trainer.warmup_steps=2",
            "trainer.window=2", "trainer.val_every=0", "logger=csv", "study.compiled=[]", "study.parity_steps=10",
            *overrides,
        ])


@pytest.fixture
def wrong_method():
    # forgets the scale: a plausible bug, caught by the gate
    m = kernels.Method("_test_wrong", softmax=lambda x, s, c: kernels.softmax(x, scale=1.0, causal=c), summary="wrong")
    kernels.register(m)
    yield m.name
    kernels.unregister(m.name)


def test_study_writes_report_csv_and_charts_and_catches_a_wrong_method(tmp_path, wrong_method, monkeypatch):
    from harness import study as study_mod

    real = study_mod.accel_config
    from omegaconf import OmegaConf

    monkeypatch.setattr(study_mod, "accel_config", lambda name: (
        OmegaConf.create({"name": name, "method": name}) if name == wrong_method else real(name)))
    cfg = study_cfg(f"study.methods=[naive,torch,{wrong_method},cuda,floor]")
    rows = run_study(cfg, tmp_path)
    by = {r.method: r for r in rows}
    assert by["torch"].status == "REFERENCE" and by["naive"].status == "PASS" and by["naive"].parity == "pass"
    assert by[wrong_method].status == "FAIL" and "forward error" in by[wrong_method].reason
    assert by[wrong_method].speedup_vs_baseline is None and by[wrong_method].tokens_per_s is None
    assert by["floor"].status == "TIMING-ONLY" and by["floor"].speedup_vs_reference is None
    if not torch.cuda.is_available():
        assert by["cuda"].status == "SKIPPED" and "GPU" in by["cuda"].reason
    assert by["naive"].speedup_vs_reference and by["torch"].speedup_vs_baseline
    report = (tmp_path / "report.md").read_text()
    assert "FAIL" in report and "TIMING-ONLY" in report and "vs naive" in report
    with open(tmp_path / "results.csv") as f:
        assert [r["method"] for r in csv.DictReader(f)] == [r.method for r in rows]
    assert (tmp_path / "throughput.png").stat().st_size > 0 and (tmp_path / "loss.png").stat().st_size > 0
    # a second study into the same directory does not overwrite the first
    run_study(study_cfg("study.methods=[torch]"), tmp_path)
    assert "FAIL" in (tmp_path / "report.md").read_text()
    assert len(list(tmp_path.glob("rerun-*/report.md"))) == 1


def test_parity_rules():
    assert parity([1.0, 1.0], [1.0, 1.01], 10, 0.02)[0]
    ok, worst, why = parity([1.0, 1.2], [1.0, 1.0], 10, 0.02)
    assert not ok and "20.0%" in why
    assert not parity([float("nan")], [1.0], 10, 0.5)[0]


def test_report_from_a_multirun_sweep_with_a_crashed_job(tmp_path):
    import json

    from harness.report import build_report
    from tests.test_train import run_cli

    sweep = tmp_path / "sweep"
    r = run_cli("-m", "model=tiny", "trainer=cpu", "trainer.max_steps=12", "trainer.val_every=0", "logger=csv",
                "accel=naive,cuda,torch", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    results = {json.loads(p.read_text())["method"]: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert set(results) == {"naive", "cuda", "torch"}  # the crash did not stop the jobs after it
    if not torch.cuda.is_available():
        assert r.returncode != 0  # Hydra reports the failed job at the end
        assert results["cuda"]["status"] == "crashed" and "cannot run here" in results["cuda"]["error"]
    rows = build_report(sweep, tmp_path / "report")
    by = {r.method: r for r in rows}
    assert by["torch"].status == "REFERENCE" and by["naive"].status == "PASS" and by["naive"].speedup_vs_reference
    if not torch.cuda.is_available():
        assert by["cuda"].status == "CRASH" and by["cuda"].speedup_vs_baseline is None
    report = (tmp_path / "report" / "report.md").read_text()
    assert "CRASH" in report or torch.cuda.is_available()
    assert (tmp_path / "report" / "results.csv").exists() and (tmp_path / "report" / "throughput.png").exists()


def test_study_profile_splits_the_step(tmp_path):
    rows = run_study(study_cfg("study.methods=[torch,naive,sdpa]", "study.profile=true"), tmp_path)
    by = {r.method: r for r in rows}
    for m in ("torch", "naive"):
        b = by[m].breakdown
        assert b and 0 < b["softmax_share"] < 1 and b["amdahl_max_speedup"] > 1
        assert abs(b["softmax_fwd_ms"] + b["softmax_bwd_ms"] + b["other_ms"] - b["step_ms"]) < 1e-6 * b["step_ms"] + 1e-9
    assert by["sdpa"].breakdown is None  # no separate softmax to time
    assert "Where the time goes" in (tmp_path / "report.md").read_text()
