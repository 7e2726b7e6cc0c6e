"""The report over the folder every ``harness.train`` writes into (``python -m harness.report
outputs/runs``): runs differing in two settings, a run that crashed after its 'running' record and one
that crashed before it. Groups are named by what differs (the full settings in a linked table), the
crashed runs form no group of None values, two runs give no interval, groups that are no sweep get no
scaling section or charts, and the charts draw without matplotlib's layout warnings."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.resume import record_failure
from harness.results import final_record, running_record, write_json
from harness.study.collect import UNPLACED
from harness.study.from_runs import build_report
from harness.study.groups import MAX_LABEL, UNPLACED_LABEL, short_labels
from harness.study.stats import MIN_INTERVAL_RUNS, log_interval

ENV = {"device_name": "cpu", "torch": "2.13.0", "triton": "3.6.0", "git_revision": "fa3d380"}
APPLIED = {"method": "torch", "attention": "composed", "loss": "native", "loss_form": "logits"}


def _config(n_layer: int, lr: float) -> dict:
    """A run's saved config (the parts a results.json carries) with the two settings that differ."""
    return {"model": {"name": "tiny", "n_layer": n_layer, "n_head": 2, "n_embd": 64, "context": 64, "vocab_size": 256},
            "data": {"name": "stdlib", "batch_size": 4, "seq_len": None, "seed": None},
            "trainer": {"max_steps": 10, "warmup_steps": 2, "lr": lr, "min_lr_ratio": 0.1, "lr_warmup_steps": 2,
                        "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "devices": "auto"},
            "seed": 1337, "precision_resolved": "32-true", "env": ENV}


def _cfg(method: str):
    return OmegaConf.create({"accel": {"name": method, "method": method}, "compile_model": False, "seed": 1337,
                             "model": {"name": "tiny"}})


def _finished(d: Path, method: str, config: dict, tps: float) -> None:
    curve = [(s, 5.0 - 0.1 * s) for s in range(10)]
    summary = {"tokens_per_s": tps, "step_ms_p50": 10.0, "step_ms_p90": 10.4, "step_ms_spread": 1.04, "noisy": False,
               "peak_mem_gib": None, "warmup_s": 0.5}
    write_json(d / "results.json", final_record(
        _cfg(method), status="completed", failure=None, guard_event=None, stopped_by=None, steps_done=10,
        previous=None, applied=APPLIED, exact=True, config=config, env=ENV, device="cpu", precision="32-true",
        world_size=1, tokens_per_step=256, checksums=[], flops_per_token=1.0, prepared={}, gate={}, summary=summary,
        curve=curve, val_loss=None, run_dir=d))


def _runs_folder(root: Path) -> None:
    """outputs/runs: two settings x (torch, naive) twice each, a crash after the 'running' record (its
    world size never recorded) and a crash before any record."""
    i = 0
    for n_layer, lr in ((2, 0.001), (4, 0.002)):
        for method, tps in (("torch", 1404.0), ("naive", 1380.0), ("torch", 1390.0), ("naive", 1410.0)):
            i += 1
            _finished(root / f"2026-12-07_06-0{i}-00", method, _config(n_layer, lr), tps)
    late = root / "2026-12-07_06-20-00"
    write_json(late / "results.json", running_record(_cfg("triton"), _config(4, 0.002), late, APPLIED, None))
    record_failure(late, _cfg("triton"), RuntimeError("boom in step 3"))
    early = root / "2026-12-07_06-21-00"
    early.mkdir(parents=True)
    record_failure(early, _cfg("cuda"), RuntimeError("no CUDA here"))


def test_report_over_a_runs_folder_names_groups_by_what_differs(tmp_path):
    root, out = tmp_path / "outputs" / "runs", tmp_path / "report"
    _runs_folder(root)
    rows = build_report(root, out, charts=False)  # the charts: the next test
    report = (out / "report.md").read_text()
    headings = [line[3:] for line in report.splitlines() if line.startswith("## ")]
    assert headings == ["n_layer=2, lr=0.001", "n_layer=4, lr=0.002", UNPLACED_LABEL, "Settings of each group"]
    assert not any("None" in h for h in headings)
    assert report.count("Settings: [Settings of each group](#settings-of-each-group).") == 3
    assert "| **model.n_layer** | 2 | 4 |" in report and "| **trainer.lr** | 0.001 | 0.002 |" in report
    crashed = {r.method: r for r in rows if r.status == "CRASH"}
    assert crashed["triton"].point == "n_layer=4, lr=0.002" and "boom in step 3" in crashed["triton"].reason
    assert crashed["cuda"].point == UNPLACED_LABEL and "no CUDA here" in crashed["cuda"].reason
    timed = [r for r in rows if r.tokens_per_s]
    assert timed and all(r.repeats == 2 < MIN_INTERVAL_RUNS for r in timed)
    assert all(r.tokens_per_s_lo is None and r.speedup_vs_baseline_lo is None for r in timed)
    assert not [line for line in report.splitlines() if line.startswith(("| torch |", "| naive |")) and " [" in line]
    assert "Scaling" not in report


@pytest.mark.slow  # four charts: about 8 s on a loaded 2-core machine
def test_its_charts_are_per_group_without_scaling_or_warnings(tmp_path):
    root, out = tmp_path / "outputs" / "runs", tmp_path / "report"
    _runs_folder(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # matplotlib's tight-layout warnings among them
        build_report(root, out)
    assert not (out / "scaling.png").exists() and not (out / "memory.png").exists()
    assert sorted(p.name for p in out.glob("*.png")) == [
        "loss-n_layer_2__lr_0_001.png", "loss-n_layer_4__lr_0_002.png",
        "throughput-n_layer_2__lr_0_001.png", "throughput-n_layer_4__lr_0_002.png"]


def test_two_runs_give_no_interval_three_do():
    assert log_interval([1404.0, 1380.0]).lo is None
    est = log_interval([1404.0, 1380.0, 1390.0])
    assert est.lo < 1390.0 < est.hi


def test_many_differing_settings_make_a_short_label():
    differing = [f"trainer.k{i}" for i in range(21)]
    settings = {("a",): {k: 1 for k in differing}, ("b",): {k: 2 for k in differing}, UNPLACED: {}}
    labels = short_labels(settings, differing)
    assert labels[("a",)].startswith("group 1: k0=1") and labels[("a",)].endswith("more)")
    assert len(labels[("a",)]) <= MAX_LABEL and labels[UNPLACED] == UNPLACED_LABEL
    assert len(set(labels.values())) == 3
