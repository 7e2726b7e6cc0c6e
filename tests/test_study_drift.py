"""Drift of the machine's speed between a study's runs (harness.study.drift): a calibration timed with a
stubbed clock (no real timing), a round deliberately slowed, and the comparisons it spoils marked
UNTRUSTED in the rows, the report, the CSV and the chart; an even machine marks nothing."""

from __future__ import annotations

import warnings

import pytest

from harness.study import drift
from harness.study.drift import DRIFT_LIMIT, calibrate, drift_of
from harness.study.rows import StudyRow
from tests import study_methods as sm
from tests.test_study import SHORT, read_csv


def ticking(ms: dict):
    """A clock that advances ``ms["now"]`` milliseconds at every read after the first of a pair."""
    state = {"t": 0.0, "reads": 0}

    def clock() -> float:
        state["reads"] += 1
        if state["reads"] % 2 == 0:  # the read that ends a timed rep
            state["t"] += ms["now"] / 1e3
        return state["t"]

    return clock


def test_calibrate_is_the_median_rep_of_its_clock():
    assert calibrate("cpu", clock=ticking({"now": 2.0}), reps=3) == pytest.approx(2.0)


def test_a_calibration_without_room_is_none_not_a_failed_study(monkeypatch):
    import torch

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(drift.torch, "randn", full)
    assert calibrate("cpu") is None
    assert drift_of([StudyRow("a", False, "PASS", runs=[{"calibration_ms": [None, 2.0]}, {"calibration_ms": [2.1, None]}])]) \
        ["drift"] == pytest.approx(2.1 / 2.0)  # (the calibrations that ran still judge the drift)


def test_drift_is_the_slowest_calibration_over_the_fastest():
    even, slowed = StudyRow("torch", False, "PASS"), StudyRow("naive", False, "PASS")
    even.runs = [{"calibration_ms": [10.0, 10.4]}]
    slowed.runs = [{"calibration_ms": [10.2, 10.0]}, {"calibration_ms": [26.0, 25.0]}]
    assert drift_of([even])["untrusted"] is False and drift_of([StudyRow("x", False, "PASS")]) is None
    d = drift_of([even, slowed])
    assert d["drift"] == pytest.approx(2.6) and d["untrusted"] and d["drift"] > DRIFT_LIMIT


def _study(tmp_path, monkeypatch):
    """torch and naive in two rounds, the runs replaced by recorded numbers: in round 2 the machine is
    2.6x slower (its calibration too), so torch reads 0.38x naive there."""
    from harness.study import run as study_mod

    speed = {"now": 10.0}
    seen: dict = {}

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        i = seen[method] = seen.get(method, -1) + 1
        if i == 1:
            speed["now"] = 26.0  # round 2: other work on the cores
        curve = [5.0 - 0.1 * s for s in range(10)]
        tps = {"torch": [100.0, 38.0], "naive": [100.0, 100.0]}[method][i]
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": tps, "step_ms_p50": 10.0,
                "step_ms_p90": 10.3, "loss_curve": curve, "final_train_loss": curve[-1]}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    monkeypatch.setattr(study_mod, "calibrate", lambda device: calibrate(device, clock=ticking(speed), reps=3))
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,naive]", "study.loss_split=[]", "study.repeats=2",
                       "study.parity_tol=0.01", "study.profile=false")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the charts draw without layout warnings
        rows = study_mod.run_study(cfg, tmp_path)
    return {r.label: r for r in rows}


@pytest.mark.slow  # a whole (faked) study with its charts: about 10 s on a loaded 2-core machine
def test_a_slowed_round_marks_the_speedup_untrusted(tmp_path, monkeypatch):
    by = _study(tmp_path, monkeypatch)
    torch_row = by["torch"]
    assert torch_row.speedup_vs_baseline == pytest.approx(0.69) and torch_row.untrusted
    assert torch_row.drift == pytest.approx(2.6)
    report = (tmp_path / "report.md").read_text()
    assert "UNTRUSTED" in report and "The machine's speed drifted" in report and "2.60x" in report
    row = next(r for r in read_csv(tmp_path / "results.csv") if r["method"] == "torch")
    assert row["untrusted"] == "True" and float(row["drift"]) == pytest.approx(2.6)
    assert (tmp_path / "throughput.png").exists()
    runs = read_csv(tmp_path / "runs.csv")
    assert all(r["calibration_ms"] for r in runs)


def _judged(calibrations: dict) -> dict:
    """torch and naive over two rounds, judged (harness.study.judge.finish) with the given calibrations."""
    from omegaconf import OmegaConf

    from harness.study.judge import finish

    rows = {}
    curve = [5.0 - 0.1 * s for s in range(10)]
    for method, tps in (("torch", [100.0, 38.0]), ("naive", [100.0, 100.0])):
        r = rows[method] = StudyRow(method, False, "PASS")
        r.runs = [{"round": i + 1, "tokens_per_s": v, "loss_curve": curve, "calibration_ms": calibrations[method][i]}
                  for i, v in enumerate(tps)]
        r.tokens_per_s, r.loss_curve, r.final_loss = sorted(tps)[1], curve, curve[-1]
    cfg = OmegaConf.create({"study": {"reference": "torch", "baseline": "naive", "parity_tol": 0.01},
                            "trainer": {"max_steps": 10}})
    settings = finish(list(rows.values()), cfg)
    return {"rows": rows, "drift": settings[""]["drift"]}


def test_an_even_machine_trusts_the_same_numbers():
    even = _judged({"torch": [[10.0, 10.3], [10.1, 10.2]], "naive": [[10.2, 10.0], [10.0, 10.4]]})
    assert even["rows"]["torch"].speedup_vs_baseline == pytest.approx(0.69) and not even["rows"]["torch"].untrusted
    assert even["drift"]["drift"] == pytest.approx(1.04) and not even["drift"]["untrusted"]
    slowed = _judged({"torch": [[10.0, 10.3], [26.0, 25.5]], "naive": [[10.2, 10.0], [25.0, 26.0]]})
    assert slowed["rows"]["torch"].untrusted and slowed["drift"]["drift"] == pytest.approx(2.6)
    assert slowed["rows"]["naive"].untrusted  # its speedup over the reference, torch, is spoiled alike


def test_the_chart_marks_untrusted_and_noisy_rows(tmp_path):
    from harness.study.charts import plot_throughput

    untrusted = StudyRow("torch", False, "REFERENCE", tokens_per_s=38.0, speedup_vs_baseline=0.38, untrusted=True)
    noisy = StudyRow("triton", False, "PASS", tokens_per_s=120.0, speedup_vs_baseline=1.2, noisy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plot_throughput([untrusted, noisy], tmp_path / "t.png", "naive", "a title " * 30)
    assert (tmp_path / "t.png").stat().st_size > 0


def test_the_limit_is_the_noisy_runs_limit():
    from harness.outcomes import NOISY_SPREAD

    assert drift.DRIFT_LIMIT == NOISY_SPREAD
