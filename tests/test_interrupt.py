"""Ctrl+C that tells the truth: a first SIGINT stops after the step without a validation pass, a second
stops at once, a signal before the first step trains nothing; each leaves results.json 'interrupted'
(never 'running'), says it in train.log, and the command lines exit 130. A study stopped so writes
its incomplete report and says how to run it again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from harness.outcomes import Interrupted
from harness.study import run as study_mod
from harness.study.run import run_study
from harness.training import run_training
from tests import study_methods as sm
from tests.test_train import ROOT, compose_cfg, run_cli

QUICK = ["model=tiny", "trainer=cpu", "trainer.max_steps=30", "trainer.window=5", "trainer.warmup_steps=2",
         "logger=csv"]


class Signals(Callback):
    """Sends ``count`` SIGINTs to this process at the end of step ``step`` (0: when fitting starts,
    before the first step), and counts the validation passes."""

    def __init__(self, step: int, count: int = 1):
        self.step, self.count, self.validations = step, count, 0

    def _send(self):
        for _ in range(self.count):
            os.kill(os.getpid(), signal.SIGINT)

    def on_fit_start(self, trainer, pl_module):
        if self.step == 0:
            self._send()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self._send()

    def on_validation_start(self, trainer, pl_module):
        self.validations += 1


@pytest.mark.slow  # a training run: tens of seconds on a loaded 2-core CPU
def test_first_sigint_stops_after_the_step_without_a_validation_pass(tmp_path):
    sig = Signals(3)
    res = run_training(compose_cfg(*QUICK, "trainer.val_every=10"), tmp_path, extra_callbacks=(sig,))
    # the signal came after GracefulStop's look at step 3 (callbacks run in order): it stops after step 4
    assert res["status"] == "interrupted" and res["stopped_by"] == "SIGINT" and res["steps_done"] == 4
    assert sig.validations == 0  # Lightning validates on an early stop; a signal's stop must not wait for it
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "interrupted"


@pytest.mark.slow  # a training run: tens of seconds on a loaded 2-core CPU
def test_second_sigint_stops_at_once_and_the_run_says_interrupted(tmp_path):
    sig = Signals(4, count=2)
    res = run_training(compose_cfg(*QUICK), tmp_path, extra_callbacks=(sig,))
    assert res["status"] == "interrupted" and res["steps_done"] == 4
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers given back


@pytest.mark.slow  # a training run: tens of seconds on a loaded 2-core CPU
def test_sigint_before_the_first_step_trains_nothing(tmp_path):
    res = run_training(compose_cfg(*QUICK), tmp_path, extra_callbacks=(Signals(0),))
    assert res["status"] == "interrupted" and res["steps_done"] == 0 and res["loss_curve"] == []


@pytest.mark.slow  # a training run: tens of seconds on a loaded 2-core CPU
def test_a_study_interrupted_before_a_run_s_first_step_writes_its_incomplete_report(tmp_path, monkeypatch,
                                                                                     capsys):
    real = study_mod.run_one

    def interrupted_run(cfg, method, compiled, run_dir, group, data_seed=None, callbacks=(), variant=""):
        return real(cfg, method, compiled, run_dir, group, data_seed, (*callbacks, Signals(0)), variant)

    monkeypatch.setattr(study_mod, "run_one", interrupted_run)
    cfg = sm.study_cfg("trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3", "logger=csv",
                       "study.methods=[torch,naive]", "study.profile=false")
    with pytest.raises(Interrupted):  # a KeyboardInterrupt: the command line exits 130
        run_study(cfg, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Speedup study (incomplete)") and "interrupted (Ctrl+C)" in report
    runs = [json.loads(p.read_text()) for p in tmp_path.glob("runs/**/results.json")]
    assert runs and all(r["status"] == "interrupted" for r in runs)  # not left 'running'
    err = capsys.readouterr().err
    assert "run it again: python -m harness.study" in err and "resume=" not in err


def _train_until(run_dir: Path, line: str, signals: int, *extra: str) -> tuple[int, str]:
    """``harness.train`` in a subprocess, sent ``signals`` SIGINTs once its output shows ``line``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "harness.train", *QUICK, "trainer.max_steps=2000",
                          "trainer.ckpt_every=5", f"hydra.run.dir={run_dir}", *extra], cwd=run_dir.parent, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, sent = [], 0
    for out in p.stdout:
        seen.append(out)
        if line in out and not sent:
            time.sleep(1.0)  # into the steps
            p.send_signal(signal.SIGINT)
            sent = 1
        elif sent and "SIGINT received: stopping after this step" in out:
            # the first one was taken: the second comes within the step it lets finish (a long one)
            if signals == 2:
                p.send_signal(signal.SIGINT)
            break
    rest, _ = p.communicate(timeout=600)
    return p.returncode, "".join(seen) + rest


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice"])
def test_ctrl_c_of_the_command_exits_130_says_interrupted_and_resumes(tmp_path, signals):
    run = tmp_path / "run"
    # twice: steps of 512 sequences (a second or so here), so the second SIGINT lands inside the step
    code, out = _train_until(run, "precision=", signals, *(["data.batch_size=512"] if signals == 2 else []))
    assert code == 130, out[-2000:]
    saved = json.loads((run / "results.json").read_text())
    assert saved["status"] == "interrupted", saved["status"]
    assert "continue with: python -m harness.train resume=" in out or "nothing to resume" in out
    log = (run / "train.log").read_text()
    assert "SIGINT received: stopping after this step" in log
    if signals == 2:
        assert "second SIGINT received: stopping now" in log
    if not (run / "checkpoints" / "last.ckpt").exists():
        return
    done = run_cli(f"resume={run}", f"trainer.max_steps={saved['steps_done'] + 5}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "harness: resumed" in (run / "train.log").read_text()
