"""The command line: one clear paragraph and exit status 2 for every mistake, before anything is
created, and a --help that lists the methods (saying which run here), the models, data and keys."""

from __future__ import annotations

import pytest
import torch

from harness.availability import runnable_accel_names
from harness.cli import precheck_overrides
from harness.config import CONF_DIR, accel_names
from harness.help import help_text
from harness.report import main as report_main
from harness.study.checks import validate_study
from harness.train import validate_with_data
from tests.test_train import run_clis


def _precheck(capsys, *argv, config="config", validate=validate_with_data) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        precheck_overrides(list(argv), CONF_DIR, config, validate=validate)
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["accel=fastest"], ["unknown accel option 'fastest'", "valid accel options", "naive", "sdpa", "floor"]),
    (["model=huge"], ["unknown model option 'huge'", "gpt2s", "small", "tiny"]),
    (["-m", "accel=naive,fastest"], ["unknown accel option 'fastest'"]),
    (["trainer.max_steps=abc"], ["trainer.max_steps=abc", "wrong type", "an integer"]),
    (["compile_model=maybe"], ["compile_model=maybe", "true or false"]),
    (["model.dropout=much"], ["model.dropout=much", "a number"]),
    (["data.seq_len=long"], ["data.seq_len=long", "an integer or null"]),
    (["trainer.max_stepz=3"], ["unknown config key 'trainer.max_stepz'", "Did you mean 'trainer.max_steps'?"]),
    (["+trainer.max_step=3"], ["'+trainer.max_step' adds a key nothing in the harness reads",
                               "Did you mean 'trainer.max_steps'?", "'++trainer.max_step=...'"]),
    (["+seeds=3"], ["Did you mean 'seed'?"]),
    (["model=tiny", "trainer.max_steps=0"], ["trainer.max_steps=0 is not accepted"]),
    (["accel=[a"], ["cannot read the command line"]),
    (["trainer=cpu,ddp"], ["trainer=cpu,ddp gives several values", "use -m to sweep"]),  # not Hydra's traceback
])
def test_user_errors_are_one_paragraph_with_exit_status_2(capsys, argv, words):
    code, err = _precheck(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one paragraph, no traceback
    for w in words:
        assert w in err


def test_the_default_config_is_checked_too_when_no_override_is_given(capsys):
    """``python -m harness.study`` with nothing after it: its config is checked before Hydra starts, as with
    overrides (a study whose reference cannot fit here is refused with exit 2, not a traceback and a
    directory)."""
    seen = []

    def refuse(cfg):
        seen.append(cfg.model.name)
        raise ValueError("refused (the default config)")

    code, err = _precheck(capsys, config="study", validate=refuse)
    assert code == 2 and err == "error: refused (the default config)\n" and seen == ["gpt2s"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
@pytest.mark.parametrize("argv", [["++trainer.max_step=3"], ["+trainer.my_own_key=1"], ["hydra/launcher=basic"],
                                  ["+hydra.job.env_set.X=1"]])
def test_added_keys_pass_unless_they_are_a_near_miss(argv):
    # '++' says "on purpose"; a '+' key near no key of the harness is code of the user's own
    precheck_overrides(["model=tiny", *argv], CONF_DIR, "config", validate=validate_with_data)  # no SystemExit


def test_an_unavailable_method_lists_every_choice_that_runs_here(capsys):
    runnable = runnable_accel_names()
    assert {"naive", "torch", "compile", "sdpa", "floor"} <= set(runnable) and "cuda" not in runnable
    code, err = _precheck(capsys, "accel=cuda", "model=tiny")
    assert code == 2 and "accel=cuda cannot run here" in err and "CUDA GPU" in err
    assert "can run here: " + ", ".join(runnable) in err
    code, err = _precheck(capsys, "accel=sdpa_flash", "model=tiny")
    assert code == 2 and "accel=sdpa_flash (method 'sdpa') cannot run here" in err and "sdpa" in err


def test_study_errors_are_clear_too(capsys):
    code, err = _precheck(capsys, "study.methods=[torch,fastest]", config="study", validate=validate_study)
    assert code == 2 and "study.methods" in err and "'fastest'" in err and "no such configuration in conf/accel/" in err
    code, err = _precheck(capsys, "data=nope", config="study", validate=validate_study)
    assert code == 2 and "unknown data option 'nope'" in err and "synthetic" in err


def test_the_cli_exits_2_without_a_traceback_and_creates_nothing(tmp_path):
    r, missing = run_clis(["model=tiny", "trainer=cpu", "accel=fastest"], ["data=text", "data.path=/no/such/file.txt"],
                          cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "valid accel options" in r.stderr
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert not any(tmp_path.iterdir())


def test_help_lists_methods_with_availability_models_data_and_keys():
    text = help_text("train", CONF_DIR, "config")
    for name in accel_names():
        assert f"\n  {name} " in text
    for name in runnable_accel_names():
        assert any(line.split()[:2] == [name, "yes"] for line in text.splitlines())
    if not torch.cuda.is_available():
        assert any(line.split()[:2] == ["cuda", "no"] for line in text.splitlines()) and "not here:" in text
    assert "12 layers, 768 wide, 12 heads, context 1024" in text  # gpt2s, from its config file
    for word in ("synthetic", "stdlib", "text", "csv", "wandb", "ddp"):
        assert word in text
    for key in ("trainer.max_steps=200", "data.batch_size=", "compile_model=false", "resume=null", "logger.mode="):
        assert key in text
    assert "optimizer steps to train" in text  # meanings come from harness/config.py's comments
    study = help_text("study", CONF_DIR, "study")
    assert "study.methods=null" in study and "study.parity_k=3.0" in study and "study.repeats=1" in study
    assert "model=tiny trainer=cpu study.methods=[naive,torch] study.compiled=[] trainer.max_steps=20" in study


def test_report_help_has_no_rst_markup(capsys):
    with pytest.raises(SystemExit):
        report_main(["--help"])
    out = capsys.readouterr().out
    assert "Build a study-style report" in out and "``" not in out


@pytest.mark.parametrize("argv,words", [
    (["accel=torch", "accel.loss_method=sdpa"],
     ["accel.loss_method='sdpa'", "needs a method that provides cross_entropy", "'sdpa' provides: attention"]),
    (["accel=torch", "accel.loss_method=naive", "accel.patch=[attention]"],
     ["accel.loss_method='naive'", "does not patch the loss", "leave accel.loss_method null"]),
    (["accel=sdpa", "accel.loss_form=linear"], ["accel.loss_form=linear needs a method that provides linear_cross_entropy"]),
    (["accel=sdpa", "accel.patch=[loss]"], ["accel.patch=['loss']", "provides none of these softmaxes"]),
])
def test_an_accel_combination_that_cannot_be_patched_fails_before_any_work(capsys, argv, words):
    """What apply_accel would refuse is refused by the command line's check, exit 2 (the run directory
    is made after that check)."""
    code, err = _precheck(capsys, "model=tiny", "trainer=cpu", *argv)
    assert code == 2 and all(w in err for w in words), err
