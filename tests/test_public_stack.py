"""The public stack (conf/accel/public.yaml: SDPA + Liger's fused linear cross-entropy) and its declared
fallback under whole-model compile (harness.fallback): what it composes to, that it is refused with the
reason where Liger cannot run, that a compiled run and a study's compiled row take the fallback, and that
the row's label and the report say so."""

from __future__ import annotations

import importlib.util

import pytest
from omegaconf import OmegaConf

import kernels
from harness.cli import UsageError
from harness.fallback import as_compiled, compiled_loss_swap, fallback_note, with_compiled_fallback
from harness.study import plan
from harness.train import validate_with_data
from tests import study_methods as sm
from tests.test_accel_loss_method import compose_cfg
from tests.test_study import SHORT, read_csv

TRAIN = ["accel=public", "model=tiny", "trainer=cpu", "logger=none"]
#: the compiled public row, labelled by the accel keys that ran (as harness.report labels its runs)
COMPILED = "public [loss_method=compile, backend=auto] + compile"


@pytest.fixture
def no_liger(monkeypatch):
    """Liger-Kernel not installed, whatever this machine has (availability asked again, and after)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "liger_kernel" else real(name, *a, **k))
    kernels.refresh()
    yield
    monkeypatch.undo()
    kernels.refresh()


def test_the_public_stack_is_sdpa_with_liger_fused_linear_cross_entropy():
    a = compose_cfg(*TRAIN).accel
    assert (a.name, a.method, dict(a.options)) == ("public", "sdpa", {"backend": "auto"})
    assert (a.loss_method, a.loss_form, list(a.patch)) == ("liger", "linear", ["attention", "loss"])
    assert a.compiled_loss_method == "compile"


def test_the_public_stack_is_refused_with_the_reason_where_liger_cannot_run(no_liger):
    with pytest.raises(UsageError, match=r"accel=public .*liger-kernel is not installed"):
        validate_with_data(compose_cfg(*TRAIN))
    assert "liger-kernel is not installed" in plan.unavailable("public")  # the study: SKIPPED with it


def test_the_fallback_replaces_the_loss_method_only_with_the_whole_model_compiled():
    a = compose_cfg(*TRAIN).accel
    assert as_compiled(a, False) is a and fallback_note(a, False) == ""
    ran = as_compiled(a, True)
    assert (ran.method, ran.loss_method, ran.loss_form, dict(ran.options)) == ("sdpa", "compile", "linear",
                                                                               {"backend": "auto"})
    assert a.loss_method == "liger"  # (a copy: the configuration itself is left as it is)
    assert as_compiled(ran, True) is ran  # applied twice (a study's run through harness.train): nothing more
    assert compiled_loss_swap(a, True) == ("liger", "compile")
    assert "the loss comes from compile instead of liger" in fallback_note(a, True)
    no_loss = OmegaConf.merge(a, {"patch": ["attention"], "loss_method": None})
    assert as_compiled(no_loss, True) is no_loss  # no loss patched: nothing to replace
    plain = OmegaConf.merge(a, {"compiled_loss_method": None})
    assert as_compiled(plain, True) is plain  # none declared: the configuration as it is


def test_a_compiled_run_takes_the_fallback_and_needs_no_liger(no_liger):
    cfg = compose_cfg(*TRAIN, "compile_model=true")
    validate_with_data(cfg)  # no liger needed: the loss that runs is compile's
    ran, note = with_compiled_fallback(cfg)
    assert ran.accel.loss_method == "compile" and "instead of liger" in note
    assert cfg.accel.loss_method == "liger"
    same, none = with_compiled_fallback(compose_cfg(*TRAIN))
    assert none == "" and same.accel.loss_method == "liger"


def test_the_studys_compiled_public_row_uses_the_fallback_and_the_report_says_so(tmp_path, monkeypatch, no_liger):
    from harness.study import run as study_mod

    seen = []

    def fake_training(cfg, run_dir, group=None, extra_callbacks=(), resume_hint=True):
        a = cfg.accel
        seen.append((a.name, bool(cfg.compile_model), a.loss_method))
        curve = [5.0 - 0.1 * s for s in range(10)]
        patched = {"method": a.method, "attention": "native", "loss": "composed" if a.loss_method else "native",
                   "loss_form": a.loss_form, "loss_method": a.loss_method or a.method}
        return {"status": "completed", "run_dir": str(run_dir), "tokens_per_s": 100.0, "step_ms_p50": 10.0,
                "step_ms_p90": 10.2, "loss_curve": curve, "final_train_loss": curve[-1], "peak_mem_gib": 1.0,
                "patched": patched}

    monkeypatch.setattr(study_mod, "run_training", fake_training)
    cfg = sm.study_cfg(*SHORT, "study.methods=[torch,public]", "study.compiled=[public]", "study.loss_split=[]",
                       "study.baseline=torch", "study.parity_tol=0.01", "study.profile=false")
    rows = study_mod.run_study(cfg, tmp_path)
    eager = next(r for r in rows if r.method == "public" and not r.compiled)
    compiled = next(r for r in rows if r.method == "public" and r.compiled)
    assert eager.status == "SKIPPED" and "liger-kernel is not installed" in eager.reason
    assert ("public", True, "compile") in seen and not any(name == "public" and not c for name, c, _ in seen)
    assert compiled.status == "PASS" and compiled.label == COMPILED
    assert "instead of liger" in compiled.fallback
    report = (tmp_path / "report.md").read_text()
    assert f"**Loss fallback** (declared by the configuration, harness/fallback.py): `{COMPILED}`: with the whole " \
        "model compiled, the loss comes from compile instead of liger" in report
    assert f"| {COMPILED} | PASS | attention (native) + linear loss (composed, compile) |" in report
    csv_rows = read_csv(tmp_path / "results.csv")
    assert [(r["compiled"], r["patched"]) for r in csv_rows if r["method"] == "public"] == [
        ("False", ""), ("True", "attention (native) + linear loss (composed, compile)")]


def test_an_eager_study_row_has_no_fallback():
    assert plan.fallback("public") == "" and plan.accel_for("public").loss_method == "liger"
    assert plan.fallback("flash_linear", "", True) == ""  # declares none


def test_the_report_over_runs_reads_the_fallback_back_from_a_runs_record():
    from harness.study.compiled import recorded_fallback

    ran = OmegaConf.to_container(as_compiled(compose_cfg(*TRAIN).accel, True))
    res = {"method": "public", "compile_model": True, "config": {"accel": ran}}
    assert "the loss comes from compile instead of liger" in recorded_fallback(res)
    assert recorded_fallback(dict(res, compile_model=False)) == ""
    asked = dict(ran, loss_method="liger")  # (a compiled run that did not take it: none to report)
    assert recorded_fallback({**res, "config": {"accel": asked}}) == ""


def test_a_fallback_that_cannot_compute_the_loss_is_refused_naming_the_key():
    from harness.accel import AccelError

    with pytest.raises(AccelError, match=r"accel.compiled_loss_method='sdpa'.*needs a method that provides"):
        validate_with_data(compose_cfg(*TRAIN, "compile_model=true", "accel.compiled_loss_method=sdpa"))
    with pytest.raises(UsageError, match=r"accel.compiled_loss_method='nope'.*unknown method 'nope'"):
        validate_with_data(compose_cfg(*TRAIN, "compile_model=true", "accel.compiled_loss_method=nope"))
