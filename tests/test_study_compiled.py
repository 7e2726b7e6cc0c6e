"""Compiled against compiled (harness.study.compiled): each whole-model-compiled row over the baseline's
compiled row at the same point, paired by round; none for eager rows, failed rows, or a baseline that
was not compiled; the report's table and the results' columns."""

from __future__ import annotations

import pytest

from harness.study.compiled import add_compiled_ratios, compiled_baseline, compiled_lines
from harness.study.rows import StudyRow
from tests import study_methods as sm
from tests.test_study import SHORT, read_csv


def _row(method, compiled, tps, status="PASS", point="", mem=8.0, **kw):
    r = StudyRow(method, compiled, status, point=point, peak_mem_gib=mem, **kw)
    r.runs = [{"round": i + 1, "tokens_per_s": v, "peak_mem_gib": mem} for i, v in enumerate(tps)]
    r.tokens_per_s = sorted(tps)[len(tps) // 2]
    return r


def test_compiled_rows_are_divided_by_the_baselines_compiled_row_round_by_round():
    base_eager, base_c = _row("sdpa_cudnn", False, [100.0, 110.0, 90.0]), _row("sdpa_cudnn", True, [200.0, 220.0, 180.0])
    ours_eager = _row("flash_linear", False, [120.0, 130.0, 110.0])
    ours_c = _row("flash_linear", True, [210.0, 231.0, 190.0], mem=6.0)  # 1.05, 1.05, 1.0556 by round
    failed = _row("triton", True, [400.0], status="FAIL")
    rows = [base_eager, ours_eager, base_c, ours_c, failed]
    add_compiled_ratios(rows, "sdpa_cudnn")
    assert ours_c.vs_compiled_baseline == pytest.approx(1.05)
    assert 1.0 < ours_c.vs_compiled_baseline_lo < 1.05 < ours_c.vs_compiled_baseline_hi  # paired: a tight interval
    assert ours_c.mem_vs_compiled_baseline == pytest.approx(0.75)
    for r in (base_eager, ours_eager, base_c, failed):  # eager, the baseline itself, a failed row: no ratio
        assert r.vs_compiled_baseline is None and r.mem_vs_compiled_baseline is None
    lines = compiled_lines(rows, "sdpa_cudnn")
    assert "## Compiled against compiled sdpa_cudnn" in lines
    ours = next(line for line in lines if line.startswith("| flash_linear + compile |"))
    assert "1.050x [" in ours and "within noise" not in ours and "0.750x" in ours
    bad = next(line for line in lines if line.startswith("| triton + compile |"))
    assert "- (triton + compile: FAIL; sdpa_cudnn + compile: PASS)" in bad


def test_no_compiled_table_without_the_baselines_compiled_row():
    rows = [_row("naive", False, [50.0, 55.0]), _row("triton", True, [200.0, 210.0])]
    add_compiled_ratios(rows, "naive")
    assert rows[1].vs_compiled_baseline is None and compiled_lines(rows, "naive") == []


def test_each_sweep_point_is_compared_with_its_own_compiled_baseline():
    rows = [_row("naive", True, [100.0, 100.0], point="T=512"), _row("naive", True, [50.0, 50.0], point="T=1024"),
            _row("triton", True, [150.0, 150.0], point="T=512"), _row("triton", True, [150.0, 150.0], point="T=1024")]
    add_compiled_ratios(rows, "naive")
    assert [r.vs_compiled_baseline for r in rows[2:]] == [pytest.approx(1.5), pytest.approx(3.0)]
    assert compiled_baseline(rows, rows[3], "naive") is rows[1]
    spread = _row("naive", True, [90.0, 90.0], point="T=512", role="spread")
    assert compiled_baseline(rows + [spread], spread, "naive") is None


def test_a_study_reports_its_compiled_rows_against_the_compiled_baseline(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    tps = {("torch", False): [100.0, 104.0, 102.0], ("triton", False): [150.0, 150.0, 150.0],
           ("torch", True): [200.0, 210.0, 205.0],
           ("triton", True): [220.0, 233.1, 226.525]}  # compiled: 1.10, 1.11, 1.105 by round (3: an interval)
    seen: dict = {}

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        key = (method, compiled)
        i = seen[key] = seen.get(key, -1) + 1
        speed = tps[key][i] if data_seed is None else 100.0
        curve = [5.0 - 0.1 * s for s in range(10)]
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": speed, "step_ms_p50": 10.0,
                "step_ms_p90": 10.2, "loss_curve": curve, "final_train_loss": curve[-1],
                "peak_mem_gib": 5.0 if method == "triton" else 10.0}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,triton]", "study.compiled=[torch,triton]", "study.loss_split=[]",
                       "study.baseline=torch", "study.repeats=3", "study.parity_tol=0.01", "study.profile=false")
    rows = run_study_rows(cfg, tmp_path)
    ours = next(r for r in rows if r.method == "triton" and r.compiled)
    assert ours.vs_compiled_baseline == pytest.approx(1.105) and ours.mem_vs_compiled_baseline == pytest.approx(0.5)
    report = (tmp_path / "report.md").read_text()
    assert "## Compiled against compiled torch" in report and "| triton + compile | " in report
    assert "1.105x [" in report
    row = next(r for r in read_csv(tmp_path / "results.csv") if r["method"] == "triton" and r["compiled"] == "True")
    assert float(row["vs_compiled_baseline"]) == pytest.approx(1.105)
    assert float(row["vs_compiled_baseline_lo"]) < 1.105 < float(row["vs_compiled_baseline_hi"])


def run_study_rows(cfg, out):
    from harness.study.run import run_study

    return run_study(cfg, out)


def test_the_chart_takes_identical_repeats():
    """Two repeats at the same tokens/s: the interval on logs comes back a rounding away from the median,
    which made matplotlib refuse a negative error bar before the lengths were clamped."""
    from harness.study.charts import _errs
    from harness.study.stats import log_interval

    est = log_interval([150.0, 150.0])
    r = StudyRow("triton", False, "PASS", tokens_per_s=est.value, tokens_per_s_lo=est.lo, tokens_per_s_hi=est.hi)
    skewed = StudyRow("cuda", False, "PASS", tokens_per_s=100.0, tokens_per_s_lo=100.5, tokens_per_s_hi=140.0)
    errs = _errs([r, skewed], "tokens_per_s")
    assert errs is not None and min(errs[0] + errs[1]) >= 0.0 and errs[0][1] == 0.0 and errs[1][1] == pytest.approx(40.0)
