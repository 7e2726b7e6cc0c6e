"""The report over a study cut short: a context sweep killed inside a point and moved to another place
(shaped like a real H200 study's directory), and a study stopped by Ctrl+C after its first point; the
report's table when the baseline is the reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.env import environment
from harness.study.from_runs import build_report
from harness.study.report import table_lines
from harness.study.rows import StudyRow
from harness.study.run import run_study
from tests import study_methods as sm

ENV = {"device_name": "NVIDIA H200", "cuda_available": True, "gpu_count": 1, "torch": "2.11.0+cu130", "cuda": "13.0",
       "triton": "3.6.0", "python": "3.12.3", "git_revision": "23ba11af-dirty"}
TOKENS = 256
#: the runs of each point, in the study's order: (method, run directory, accel.patch, data seed)
RUNS = [("sdpa_cudnn", "sdpa_cudnn", ["attention", "loss"], None),
        ("sdpa_cudnn", "sdpa_cudnn-dataseed1338", ["attention", "loss"], 1338),
        ("torch", "torch", ["attention", "loss"], None),
        ("triton", "triton-attention+loss", ["attention", "loss"], None),
        ("triton", "triton-attention", ["attention"], None),
        ("flash", "flash", ["attention", "loss"], None)]
TPS = {"sdpa_cudnn": 350e3, "torch": 200e3, "triton": 300e3, "flash": 340e3}
PATCHED = {"sdpa_cudnn": {"method": "sdpa", "attention": "native", "loss": None, "loss_form": "logits"},
           "torch": {"method": "torch", "attention": "composed", "loss": "native", "loss_form": "logits"},
           "triton": {"method": "triton", "attention": "composed", "loss": "native", "loss_form": "logits"},
           "flash": {"method": "flash", "attention": "native", "loss": None, "loss_form": "logits"}}


def _curve(T: int, seed) -> list:
    drift = 0.03 if seed else 0.0  # another data order: a curve a few % away, growing with the steps
    return [[s, (10.7 - 0.37 * s - 0.001 * T / 64) * (1 + drift * s / 20)] for s in (0, 5, 10, 15, 20)]


def _fake_study(where: Path, ran_at: str, contexts: list, reached: int, started: int) -> Path:
    """A study directory as harness.study leaves it when killed inside point ``reached + 1`` after its
    first ``started`` runs there: runs/T<T>/<slug>/{results.json, parity_probe.json}, study.json (no
    progress: written before it existed), results.json's run_dir where it ran (``ran_at``)."""
    study = {"methods": ["torch", "triton", "flash", "sdpa_cudnn"], "compiled": [], "loss_split": ["triton"],
             "linear_loss": [], "reference": "sdpa_cudnn", "baseline": "torch", "parity_steps": None,
             "parity_k": 3.0, "parity_floor": 0.005, "parity_tol": None, "repeats": 1, "sweep": "context",
             "contexts": contexts, "models": ["small"]}
    rows = []
    for i, T in enumerate(contexts[:reached + 1]):
        point, batch = f"T={T} batch {TOKENS // T}", TOKENS // T
        for method, slug, patch, seed in RUNS[:started] if i == reached else RUNS:
            d, old = where / "runs" / f"T{T}" / slug, f"{ran_at}/runs/T{T}/{slug}"
            d.mkdir(parents=True)
            model = {"name": "gpt2s", "n_layer": 12, "n_head": 12, "n_embd": 768, "context": T, "vocab_size": 50304}
            data = {"name": "stdlib", "batch_size": batch, "seq_len": None, "seed": seed}
            curve = _curve(T, seed)
            res = {"status": "completed", "method": method, "exact": True, "patched": PATCHED[method],
                   "compile_model": False, "model": model, "data": data, "seed": 1337, "device": "NVIDIA H200",
                   "precision": "bf16-mixed", "world_size": 1, "tokens_per_s": TPS[method] * (1.0 - T / 1024),
                   "step_ms_p50": 50.0, "step_ms_p90": 51.0, "peak_mem_gib": 14.5, "warmup_s": 0.3,
                   "final_train_loss": curve[-1][1], "loss_curve": [v for _, v in curve], "env": ENV,
                   "run_dir": old, "gate": {"checked": True},
                   "config": {"accel": {"name": method, "method": method, "patch": patch, "loss_form": "logits"},
                              "model": model, "data": data, "seed": 1337, "env": ENV,
                              "trainer": {"max_steps": 20, "warmup_steps": 5, "lr": 6e-4, "lr_warmup_steps": 20}}}
            (d / "results.json").write_text(json.dumps(res))
            (d / "parity_probe.json").write_text(json.dumps({"every": 5, "batches": 2, "curve": curve}))
            words = "attention" if patch == ["attention"] else "attention + loss" if method == "triton" else ""
            rows.append({"method": method, "compiled": False, "status": "PASS", "point": point, "role":
                         "spread" if seed else "", "variant": "attention" if patch == ["attention"] else "",
                         "patch": words, "data_seed": seed, "point_values": {"context": T, "batch_size": batch},
                         "runs": [{"round": 1, "run_dir": old, "tokens_per_s": res["tokens_per_s"]}]})
    (where / "study.json").write_text(json.dumps({"env": ENV, "config": {"study": study}, "rows": rows}))
    return where


def test_report_over_a_killed_and_moved_sweep(tmp_path):
    src = _fake_study(tmp_path / "copy" / "study-context", "/gone/o/study-context", [32, 64, 128, 256], 2, 2)
    rows = build_report(src, tmp_path / "rep")
    # no phantom rows: every row the study recorded is the run collected for it (the study was moved)
    assert not [r for r in rows if r.status == "CRASH"], [(r.point, r.label, r.reason) for r in rows]
    by = {(r.point, r.label): r for r in rows}
    points = list(dict.fromkeys(r.point for r in rows))
    assert points == ["T=32 batch 8", "T=64 batch 4", "T=128 batch 2"]  # the spread run is no point of its own
    # labels: only triton (study.loss_split) carries what it asked to patch
    assert {lab for p, lab in by if p == "T=32 batch 8"} == {
        "sdpa_cudnn", "sdpa_cudnn (data seed 1338)", "torch", "triton: attention + loss", "triton: attention", "flash"}
    # the study's reference and baseline, and its spread run setting the tolerance
    ref, spread = by[("T=32 batch 8", "sdpa_cudnn")], by[("T=32 batch 8", "sdpa_cudnn (data seed 1338)")]
    assert ref.status == "REFERENCE" and spread.role == "spread" and spread.parity == "spread"
    torch_row = by[("T=32 batch 8", "torch")]
    assert torch_row.status == "PASS" and torch_row.speedup_vs_baseline == pytest.approx(1.0)
    assert torch_row.speedup_vs_reference == pytest.approx(200 / 350)
    assert torch_row.parity_tol > 0.005 or torch_row.parity_step == 0  # past step 0 the spread, not the floor
    assert by[("T=128 batch 2", "sdpa_cudnn")].status == "REFERENCE"  # the point it was killed in: what finished
    report = (tmp_path / "rep" / "report.md").read_text()
    head = report.split("\n## ")[0]
    # the runs' environment, not this machine's
    assert "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, git 23ba11af-dirty" in head
    assert environment()["git_revision"] not in report and "missing here" not in report
    assert "spread reached" in report and "vs sdpa_cudnn" in report and "vs torch" in report
    assert "**Incomplete**" in head and "2 of 4 points finished" in head and "point 3 (T=128) was under way" in head
    assert "not reached: T=256" in head
    scaling = report.split("## Scaling")[1]
    assert "| torch | " in scaling and "| triton: attention | " in scaling and "data seed" not in scaling
    saved = json.loads((tmp_path / "rep" / "study.json").read_text())
    assert saved["env"]["device_name"] == "NVIDIA H200" and saved["progress"]["complete"] is False


def test_report_settings_from_the_command_line_win(tmp_path):
    src = _fake_study(tmp_path / "s", "/gone/s", [32, 64], 1, 6)  # complete: no note
    rows = build_report(src, tmp_path / "rep", reference="torch")
    assert {r.label for r in rows if r.status == "REFERENCE"} == {"torch"}
    assert "Incomplete" not in (tmp_path / "rep" / "report.md").read_text()


def test_a_study_stopped_after_its_first_point_leaves_its_report(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    real, seen = study_mod.run_one, {}

    def stop_at_second_point(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        if cfg.model.context == 64:  # the report of point 1 is there before point 2 starts
            seen["report"] = (tmp_path / "report.md").read_text()
            seen["charts"] = sorted(p.name for p in tmp_path.glob("*.png"))
            raise KeyboardInterrupt
        return real(cfg, method, compiled, run_dir, group, data_seed, callbacks, variant)

    monkeypatch.setattr(study_mod, "run_one", stop_at_second_point)
    cfg = sm.study_cfg("trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3", "logger=csv",
                       "study.methods=[torch,naive]", "study.sweep=context", "study.contexts=[32,64,128]",
                       "study.tokens_per_step=256", "study.profile=false")
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, tmp_path)
    mid = seen["report"]  # what a kill at that moment would have left
    assert "## T=32 batch 8" in mid and "| torch | REFERENCE |" in mid and "| naive | PASS |" in mid
    assert "1 of 3 points finished" in mid and "not reached: T=64 batch 4, T=128 batch 2" in mid
    assert {"throughput.png", "loss.png"} <= set(seen["charts"])  # one point so far: its charts
    final = (tmp_path / "report.md").read_text()
    assert final.startswith("# Speedup study (incomplete)") and "interrupted (Ctrl+C)" in final
    assert "point 2 (T=64 batch 4) was under way" in final and "| naive | PASS |" in final
    progress = json.loads((tmp_path / "study.json").read_text())["progress"]
    assert progress["done"] == 1 and not progress["complete"]
    # the report tool reads it back: no phantom rows, the progress as the study recorded it
    shutil.copytree(tmp_path, tmp_path.parent / "moved")
    rows = build_report(tmp_path.parent / "moved", tmp_path.parent / "rep")
    assert {(r.label, r.status) for r in rows} == {("torch", "REFERENCE"), ("torch (data seed 1338)", "REFERENCE"),
                                                    ("naive", "PASS")}
    assert "point 2 (T=64 batch 4) was under way" in (tmp_path.parent / "rep" / "report.md").read_text()


def test_a_finished_study_says_nothing_of_progress(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        curve = [5.0 - 0.1 * s for s in range(10)]
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": 100.0, "step_ms_p50": 10.0,
                "step_ms_p90": 10.1, "loss_curve": curve, "final_train_loss": curve[-1]}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    cfg = sm.study_cfg("study.methods=[torch,naive]", "study.sweep=context", "study.contexts=[32,64]",
                       "study.tokens_per_step=256", "study.parity_tol=0.01", "study.profile=false")
    run_study(cfg, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Speedup study\n") and "Incomplete" not in report
    assert json.loads((tmp_path / "study.json").read_text())["progress"]["complete"] is True


def test_one_ratio_column_when_the_baseline_is_the_reference():
    """study.baseline == study.reference: the same runs, so one "vs" column, its cells in place."""
    row = StudyRow("flash", False, "PASS", speedup_vs_baseline=1.012, speedup_vs_reference=1.012,
                   tokens_per_s=356167.0)
    for baseline, reference in (("sdpa_cudnn", "sdpa_cudnn"), ("naive", "torch")):
        cfg = OmegaConf.create({"study": {"baseline": baseline, "reference": reference}})
        head, rule, line = table_lines([row], cfg)
        cols = [c.strip() for c in head.strip("|").split("|")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(cols) == rule.count("---")
        ratios = [c for c in cols if c.startswith("vs ")]
        assert ratios == ([f"vs {baseline} [95% CI]"] if baseline == reference else
                          [f"vs {baseline} [95% CI]", f"vs {reference} [95% CI]"])
        assert cells[cols.index(ratios[0])].startswith("1.012")
        assert cells[cols.index("step ms p50 / p90")] == "-"
