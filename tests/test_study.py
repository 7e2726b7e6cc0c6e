"""The speedup study on the CPU with the tiny model: report, CSV and charts; a wrong method is caught by
the gate and, with the gate off, by parity; repeats, sweeps, the report tool and the config checks."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import kernels
from harness.config import ConfigError
from harness.study.checks import validate_study
from harness.study.parity import judge
from harness.study.run import run_study
from tests import study_methods as sm

SHORT = ["trainer.max_steps=10", "trainer.warmup_steps=2", "trainer.window=5"]


@pytest.fixture
def methods(monkeypatch):
    sm.install(monkeypatch.setattr)
    yield
    sm.uninstall()


@pytest.fixture
def wrong_method(monkeypatch):
    # forgets the scale: a plausible bug, caught by the gate
    from harness.study import plan as study_mod

    m = kernels.Method("_test_wrong", softmax=lambda x, s, c: kernels.softmax(x, scale=1.0, causal=c), summary="wrong")
    kernels.register(m)
    real, names = study_mod.accel_config, study_mod.accel_names
    monkeypatch.setattr(study_mod, "accel_config", lambda name: (
        OmegaConf.create({"name": name, "method": name}) if name == m.name else real(name)))
    monkeypatch.setattr(study_mod, "accel_names", lambda: names() + [m.name])
    yield m.name
    kernels.unregister(m.name)


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_study_writes_report_csv_and_charts_and_catches_a_wrong_method(tmp_path, wrong_method):
    # one study for the gate, the outputs and the profile (study.profile=true on the CPU: the plumbing)
    cfg = sm.study_cfg(*SHORT, f"study.methods=[naive,torch,{wrong_method},cuda,floor,sdpa]", "study.profile=true",
                       "logger=csv")
    rows = run_study(cfg, tmp_path)
    by = {r.label: r for r in rows}
    assert by["torch"].status == "REFERENCE" and by["naive"].status == "PASS" and by["naive"].parity == "pass"
    assert by["naive"].judged == "gate + parity"
    assert by["torch (data seed 1338)"].role == "spread" and by["torch (data seed 1338)"].parity == "spread"
    assert by[wrong_method].status == "FAIL" and "forward error" in by[wrong_method].reason
    assert by[wrong_method].speedup_vs_baseline is None and by[wrong_method].tokens_per_s is None
    assert by["floor"].status == "TIMING-ONLY" and by["floor"].speedup_vs_reference is None
    if not torch.cuda.is_available():  # cuda is in the default study.loss_split: its twin is skipped alike
        for label in ("cuda: attention + loss", "cuda: attention"):
            assert by[label].status == "SKIPPED" and "GPU" in by[label].reason
    assert by["naive"].speedup_vs_reference and by["torch"].speedup_vs_baseline
    assert by["naive"].noisy in (True, False) and by["naive"].step_spread >= 1.0
    report = (tmp_path / "report.md").read_text()
    assert "FAIL" in report and "TIMING-ONLY" in report and "vs naive" in report and "SKIPPED" in report
    assert "data seed 1338" in report and "Parity: held-out probe loss" in report
    assert [r["method"] for r in read_csv(tmp_path / "results.csv")] == [r.method for r in rows]
    assert (tmp_path / "throughput.png").stat().st_size > 0 and (tmp_path / "loss.png").stat().st_size > 0
    run = json.loads((tmp_path / "runs" / "naive" / "results.json").read_text())
    assert run["noisy"] in (True, False) and run["step_ms_spread"] >= 1.0  # every train run records it
    probe = json.loads((tmp_path / "runs" / "naive" / "parity_probe.json").read_text())
    assert [s for s, _ in probe["curve"]] == [0, 5, 10]  # step 0, then every window
    # where the time goes, one eager step (CPU wall clock: the numbers mean little, the parts add up)
    for m in ("torch", "naive"):
        b = by[m].breakdown
        parts = b["parts"]
        assert parts["attention"]["name"] == "attention softmax" and 0 < b["softmax_share"] < 1
        assert b["amdahl_max_speedup"] > 1 and parts["loss"]["ms"] > 0 and parts["matmuls"]["ms"] > 0
        tol = 1e-6 * b["step_ms"] + 1e-9
        assert abs(b["softmax_fwd_ms"] + b["softmax_bwd_ms"] + b["other_ms"] - b["step_ms"]) < tol
        assert abs(sum(p["ms"] for p in parts.values()) - b["step_ms"]) < tol
        assert all(p["amdahl"] >= 1 for p in parts.values())
        # the model's bound for its two softmaxes: attention and loss at zero together, above either alone
        both = b["step_ms"] / (b["step_ms"] - parts["attention"]["ms"] - parts["loss"]["ms"])
        assert abs(b["amdahl_softmaxes"] - both) < 1e-6 * both
        assert b["amdahl_softmaxes"] > max(parts["attention"]["amdahl"], parts["loss"]["amdahl"])
    assert by["sdpa"].breakdown["parts"]["attention"]["name"] == "fused attention"  # no separate softmax to time
    assert "Where the time goes" in report and "fused attention" in report
    bound = by["naive"].breakdown["amdahl_softmaxes"]  # (naive: the study's baseline)
    assert "with the baseline `naive`'s step" in report and f"at most {bound:.2f}x as fast" in report
    assert f"torch {by['torch'].speedup_vs_baseline:.2f}x" in report.split("The model's bound")[1]
    # a second study into the same directory does not overwrite the first
    run_study(sm.study_cfg(*SHORT, "study.methods=[torch]", "study.parity_tol=0.05"), tmp_path)
    assert "FAIL" in (tmp_path / "report.md").read_text()
    assert len(list(tmp_path.glob("rerun-*/report.md"))) == 1


def test_parity_with_the_gate_off_fails_an_unnormalized_softmax_and_passes_a_correct_one(tmp_path, methods):
    """The real study end to end, once: the default study data (bytes), the kernel gate off."""
    cfg = sm.study_cfg("study.kernel_gate=false", f"study.methods=[torch,{sm.CORRECT},{sm.UNNORMALIZED}]")
    assert cfg.data.name == "stdlib"  # the study's default data, where the loss falls
    rows = run_study(cfg, tmp_path)
    by = {r.method: r for r in rows if not r.role}
    bad, good = by[sm.UNNORMALIZED], by[sm.CORRECT]
    assert bad.status == "FAIL" and bad.parity == "FAIL" and "probe loss departs" in bad.reason
    assert bad.judged == "parity only (kernel gate off)" and bad.speedup_vs_baseline is None
    assert good.status == "PASS" and good.parity == "pass" and good.judged == "parity only (approximate by design)"
    assert good.parity_dev < good.parity_tol and good.speedup_vs_reference
    ref = by["torch"].probe_curve
    assert ref[-1][1] < 0.9 * ref[0][1]  # the loss falls
    report = (tmp_path / "report.md").read_text()
    assert "parity only (kernel gate off)" in report and "that spread reached" in report


def fixture_curves() -> dict:
    return json.loads(sm.FIXTURE.read_text())


def test_parity_rule_on_recorded_runs_of_20_seeds():
    """tests/data/parity_curves.json: probe curves of 20 real studies (scripts/record_parity_curves.py,
    the configuration of the test above with seeds 1-20): the rule passes the correct softmax for every
    seed and fails the unnormalized one for every seed."""
    from harness.config import StudyConfig

    data = fixture_curves()
    s = StudyConfig()
    assert data["study"]["parity_k"] == s.parity_k and data["study"]["parity_floor"] == s.parity_floor
    seeds = data["seeds"]
    assert len(seeds) == 20
    for seed, runs in seeds.items():
        ref, spread = runs["torch"]["probe"], runs["spread"]["probe"]
        good = judge(runs[sm.CORRECT]["probe"], ref, 10**9, s.parity_k, s.parity_floor, spread)
        bad = judge(runs[sm.UNNORMALIZED]["probe"], ref, 10**9, s.parity_k, s.parity_floor, spread)
        assert good.passed, f"seed {seed}: {good}"
        assert not bad.passed, f"seed {seed}: {bad}"


def test_parity_rules():
    fixed = dict(steps=10, k=3.0, floor=0.0)
    assert judge([(0, 1.0), (1, 1.0)], [(0, 1.0), (1, 1.01)], fixed=0.02, **fixed).passed
    v = judge([(0, 1.0), (1, 1.2)], [(0, 1.0), (1, 1.0)], fixed=0.02, **fixed)
    assert not v.passed and "20.00%" in v.reason and v.step == 1
    assert not judge([(0, float("nan"))], [(0, 1.0)], fixed=0.5, **fixed).passed
    assert not judge([], [(0, 1.0)], fixed=0.5, **fixed).passed  # nothing to compare is no pass
    # derived: the tolerance at a step is k x the reference's spread up to that step, never below the floor
    ref, spread = [(0, 5.0), (5, 4.0), (10, 3.0)], [(0, 5.0), (5, 4.04), (10, 3.03)]  # 0%, 1%, 1%
    assert judge([(0, 5.0), (5, 4.1), (10, 3.0)], ref, 100, 3.0, 0.005, spread).passed  # 2.5% < 3%
    early = judge([(0, 5.1), (5, 4.0), (10, 3.0)], ref, 100, 3.0, 0.005, spread)
    assert not early.passed and early.step == 0 and early.tol == 0.005  # at step 0 the spread is 0: the floor
    assert judge([(0, 5.0), (5, 4.0), (10, 3.0), (15, 9.9)], ref + [(15, 2.5)], 10, 3.0, 0.005, spread).passed
    # (step 15 lies outside the 10-step window: not judged)


def test_repeats_interleave_and_write_intervals(tmp_path, monkeypatch):
    """study.repeats=3 with the runs replaced by recorded numbers: the order is round-robin, and the
    CSV, runs.csv and report carry medians, 95% intervals and the noise markers."""
    from harness.study import run as study_mod

    calls = []
    tps = {"torch": [100.0, 102.0, 98.0], "naive": [50.0, 51.0, 49.0], "triton": [101.0, 99.0, 103.0]}

    def fake_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        calls.append(method)
        i = sum(1 for c in calls if c == method) - 1
        curve = [5.0 - 0.1 * s for s in range(10)]
        p50 = 10.0
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": tps[method][i], "step_ms_p50": p50,
                "step_ms_p90": p50 * (1.3 if method == "naive" and i == 1 else 1.02), "loss_curve": curve,
                "final_train_loss": curve[-1], "patched": {"attention": "composed"}}

    monkeypatch.setattr(study_mod, "run_one", fake_run)
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,naive,triton]", "study.repeats=3", "study.parity_tol=0.01",
                       "study.profile=false", "study.loss_split=[]")
    rows = run_study(cfg, tmp_path)
    assert calls == ["torch", "naive", "triton"] * 3  # round-robin, never one method's repeats back to back
    by = {r.method: r for r in rows}
    assert by["torch"].tokens_per_s == 100.0 and by["torch"].repeats == 3
    assert by["torch"].tokens_per_s_lo < 100.0 < by["torch"].tokens_per_s_hi
    sp = by["torch"].speedup_vs_baseline  # paired by round: 100/50, 102/51, 98/49 = 2 exactly
    assert sp == pytest.approx(2.0) and by["torch"].speedup_vs_baseline_lo == pytest.approx(2.0)
    tri = by["triton"]  # 101/100, 99/102, 103/98 around 1: within noise
    assert tri.speedup_vs_reference_lo < 1.0 < tri.speedup_vs_reference_hi and "vs torch" in tri.noise
    assert by["naive"].noisy and by["naive"].step_spread == pytest.approx(1.3) and not by["torch"].noisy
    csv_rows = {r["method"]: r for r in read_csv(tmp_path / "results.csv")}
    for col in ("tokens_per_s_lo", "tokens_per_s_hi", "speedup_vs_baseline_lo", "speedup_vs_reference_hi", "noise",
                "noisy", "step_spread", "repeats"):
        assert col in csv_rows["torch"]
    assert float(csv_rows["torch"]["tokens_per_s_lo"]) < 100.0 and csv_rows["naive"]["noisy"] == "True"
    assert "within noise" in csv_rows["triton"]["noise"]
    assert len(read_csv(tmp_path / "runs.csv")) == 9
    report = (tmp_path / "report.md").read_text()
    assert "100 [" in report and "within noise" in report and "NOISY" in report and "Repeats: 3" in report


@pytest.mark.slow  # a whole study per context point (~6 s)
def test_context_sweep_charts_and_records_an_oom(tmp_path, monkeypatch):
    from harness.study import run as study_mod

    real = study_mod.run_one

    import lightning as L

    class OutOfMemoryInTraining(L.Callback):  # as on a GPU: after the run wrote its "running" record
        def on_train_batch_start(self, *args):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def run_or_oom(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        if method == "naive" and cfg.model.context == 64:
            callbacks = (*callbacks, OutOfMemoryInTraining())
        return real(cfg, method, compiled, run_dir, group, data_seed, callbacks, variant)

    monkeypatch.setattr(study_mod, "run_one", run_or_oom)
    cfg = sm.study_cfg("trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3",
                       "study.methods=[torch,naive]", "study.sweep=context", "study.contexts=[32,64]",
                       "study.tokens_per_step=256", "study.parity_tol=0.05")
    rows = run_study(cfg, tmp_path)
    by = {(r.point_values["context"], r.method): r for r in rows}
    assert by[(32, "naive")].status == "PASS" and by[(32, "naive")].point_values["batch_size"] == 8
    oom = by[(64, "naive")]
    assert oom.status == "OOM" and "out of memory at T = 64" in oom.reason and oom.tokens_per_s is None
    assert by[(64, "torch")].status == "REFERENCE" and by[(64, "torch")].point_values["batch_size"] == 4
    for name in ("scaling.png", "memory.png", "throughput-T_32_batch_8.png", "loss-T_64_batch_4.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    csv_rows = read_csv(tmp_path / "results.csv")
    got = {(r["context"], r["method"], r["status"]) for r in csv_rows}
    assert got >= {("64", "naive", "OOM"), ("32", "torch", "REFERENCE")}
    report = (tmp_path / "report.md").read_text()
    assert "## T=64 batch 4" in report and "Scaling" in report and "| naive | " in report and "OOM" in report
    # the run's own record is closed with the verdict (it said "running" when training began)
    stopped = json.loads((tmp_path / "runs" / "T64" / "naive" / "results.json").read_text())
    assert stopped["status"] == "oom" and "out of memory at T = 64" in stopped["error"]
    # the report tool reads the sweep back: the same points in order of T, the OOM once, the charts
    from harness.study.from_runs import build_report

    again = build_report(tmp_path, tmp_path.parent / "sweep-report")
    assert {(r.point, r.method, r.status) for r in again} >= {("T=64 batch 4", "naive", "OOM"),
                                                            ("T=32 batch 8", "naive", "PASS")}
    assert [r.point for r in again if r.method == "naive"] == ["T=32 batch 8", "T=64 batch 4"]
    # ... also from a run record a study never closed (a study killed with it, or before this fix)
    (tmp_path / "runs" / "T64" / "naive" / "results.json").write_text(json.dumps(dict(stopped, status="running")))
    again = build_report(tmp_path, tmp_path.parent / "sweep-report-2")
    assert [(r.point, r.status) for r in again if r.method == "naive"] == [("T=32 batch 8", "PASS"),
                                                                         ("T=64 batch 4", "OOM")]
    assert (tmp_path.parent / "sweep-report" / "scaling.png").exists()


@pytest.mark.slow
def test_model_sweep_runs_each_model_with_its_own_shape(tmp_path):
    """study.sweep=model: a point per model config, labelled by its name, at the model's own context
    and batch (tiny: 128 x 8, not the quick config's 64 x 4), the report's sections named so."""
    cfg = sm.study_cfg("trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3",
                       "study.methods=[torch,naive]", "study.sweep=model", "study.models=[tiny]", "study.parity_tol=0.05")
    rows = run_study(cfg, tmp_path)
    assert [(r.point, r.method, r.status) for r in rows] == [("tiny", "torch", "REFERENCE"), ("tiny", "naive", "PASS")]
    assert all(r.point_values == {"model": "tiny", "context": 128, "batch_size": 8} for r in rows)
    assert "## tiny" in (tmp_path / "report.md").read_text()
    done = json.loads((tmp_path / "runs" / "tiny" / "naive" / "results.json").read_text())
    assert done["model"]["context"] == 128 and done["data"]["batch_size"] == 8


def _write_run(d: Path, method: str, max_steps: int, curve: list, tps: float, **extra) -> None:
    d.mkdir(parents=True)
    res = {"status": "completed", "method": method, "compile_model": False, "exact": True, "seed": 1,
           "model": {"name": "tiny", "n_layer": 2, "n_embd": 128, "n_head": 4, "context": 128},
           "data": {"name": "stdlib", "batch_size": 8, "seq_len": None, "seed": extra.pop("data_seed", None)},
           "config": {"trainer": {"max_steps": max_steps, "lr": 6e-4, "lr_warmup_steps": 20}},
           "precision": "32-true", "world_size": 1, "tokens_per_s": tps, "step_ms_p50": 10.0, "step_ms_p90": 10.5,
           "loss_curve": curve, "final_train_loss": curve[-1], **extra}
    (d / "results.json").write_text(json.dumps(res))


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_report_groups_comparable_runs_and_leaves_its_source_untouched(tmp_path, capsys):
    from harness.report import main

    src = tmp_path / "runs"
    short = [5.0 - 0.2 * i for i in range(10)]
    long = [5.0 - 0.1 * i for i in range(40)]  # another schedule: its curve differs by ~30% from the short one
    _write_run(src / "a", "torch", 10, short, 1000.0)
    _write_run(src / "b", "naive", 10, short, 800.0)
    _write_run(src / "c", "naive", 40, long, 810.0)  # a longer run: never compared with the short reference
    _write_run(src / "d", "torch", 40, long, 1010.0)
    _write_run(src / "e", "triton", 10, [v * 1.1 for v in short], 1500.0)  # a wrong method
    (src / "study").mkdir()
    (src / "study" / "study.json").write_text(json.dumps({"config": {"study": {"parity_k": 3.0}}, "rows": [
        {"method": "cuda", "compiled": False, "status": "SKIPPED", "reason": "needs a CUDA GPU", "runs": []}]}))
    before = _tree_hash(src)
    main([str(src)])
    assert _tree_hash(src) == before  # nothing in the source was created, changed or removed
    err = capsys.readouterr().err
    out = Path(err.strip().split(" to ")[-1])
    assert out.parent == tmp_path and out.name.startswith("runs-report-")
    rows = {(r["point"], r["method"]): r for r in read_csv(out / "results.csv")}
    points = {p for p, _ in rows}
    assert len(points) == 3 and any("max_steps=10" in p for p in points) and any("max_steps=40" in p for p in points)
    short_p = next(p for p in points if "max_steps=10" in p)
    long_p = next(p for p in points if "max_steps=40" in p)
    assert rows[(short_p, "naive")]["status"] == "PASS" and rows[(long_p, "naive")]["status"] == "PASS"
    assert rows[(short_p, "triton")]["status"] == "FAIL"
    assert rows[(next(p for p in points if p not in (short_p, long_p)), "cuda")]["status"] == "SKIPPED"
    assert "SKIPPED" in (out / "report.md").read_text()


@pytest.mark.slow  # a three-job Hydra multirun in a subprocess (~8 s)
def test_report_from_a_multirun_sweep_with_a_crashed_job(tmp_path):
    from harness.study.from_runs import build_report
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
    # (the reasons in the message: this assertion failed once in a full local run, not reproduced alone)
    assert by["torch"].status == "REFERENCE", by["torch"].reason
    assert by["naive"].status == "PASS" and by["naive"].speedup_vs_reference, (
        by["naive"].reason, results["naive"].get("status"), results["naive"].get("gate"))
    if not torch.cuda.is_available():
        assert by["cuda"].status == "CRASH" and by["cuda"].speedup_vs_baseline is None
    report = (tmp_path / "report" / "report.md").read_text()
    assert "CRASH" in report or torch.cuda.is_available()
    assert (tmp_path / "report" / "results.csv").exists() and (tmp_path / "report" / "throughput.png").exists()


@pytest.mark.parametrize("override,message", [
    ("study.methods=[torch,nope]", "study.methods='nope'"),
    ("study.parity_steps=500", "study.parity_steps=500"),
    ("study.sweep=contexts", "study.sweep='contexts'"),
    ("study.models=[gpt2s,gpt9]", "study.models='gpt9'"),
    ("study.parity_every=3", "study.parity_every=3"),
    ("study.repeats=0", "study.repeats=0"),
])
def test_bad_study_keys_are_refused(override, message):
    with pytest.raises(ConfigError, match="not accepted") as e:
        validate_study(sm.study_cfg(override, *(["study.sweep=model"] if "models" in override else [])))
    assert message in str(e.value)
    sweep = sm.study_cfg("study.sweep=context", "study.contexts=[512,768]", "study.tokens_per_step=1024")
    with pytest.raises(ConfigError, match="768 does not divide"):
        validate_study(sweep)


def test_a_reference_that_cannot_fit_is_refused_before_any_run(monkeypatch):
    """qwen25_05b's default reference, torch, keeps 24 layers of T x T scores (99 GiB on a GPU): its run would
    be refused, and a study without it judges nothing; the refusal names the references that fit (sdpa's
    fused attention keeps no scores)."""
    from harness import memory
    from harness.study import checks

    monkeypatch.delenv("HARNESS_SKIP_MEMORY_CHECK", raising=False)
    cpu = ("model=qwen25_05b", "trainer.accelerator=cpu")
    torch_step = memory.step_memory(sm.study_cfg(*cpu, "accel=torch", quick=False), gpu=False).total
    sdpa_step = memory.step_memory(sm.study_cfg(*cpu, "accel=sdpa", quick=False), gpu=False).total
    assert sdpa_step < torch_step
    monkeypatch.setattr(checks, "available_memory", lambda gpu: (sdpa_step + torch_step) // 2)
    with pytest.raises(ConfigError, match="study.reference='torch' cannot run here") as e:
        validate_study(sm.study_cfg(*cpu, quick=False))
    msg = str(e.value)
    assert "judges nothing" in msg and f"sdpa ({sdpa_step / memory.GIB:.1f} GiB)" in msg
    assert "torch (" not in msg and "floor" not in msg  # (not itself; no timing-only stand-in)
    validate_study(sm.study_cfg(*cpu, "study.reference=sdpa", quick=False))  # fits: no refusal
    validate_study(sm.study_cfg(*cpu, "study.sweep=context", "study.contexts=[1024,2048]",
                                quick=False))  # a sweep's points may outgrow it: their rows say so
    monkeypatch.setattr(checks, "available_memory", lambda gpu: sdpa_step // 4)
    with pytest.raises(ConfigError, match="No reference's step fits here at this size"):
        validate_study(sm.study_cfg(*cpu, quick=False))


def test_bad_study_keys_fail_fast_on_the_command_line(tmp_path):
    from tests.test_train import run_clis

    for r in run_clis(["study.methods=[torch,nope]"], ["study.parity_steps=500"], cwd=tmp_path, module="harness.study"):
        assert r.returncode == 2, r.stderr
        assert "not accepted" in r.stderr and "No study was started" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "outputs").exists()  # refused before any directory was made
