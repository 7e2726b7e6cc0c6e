"""Interrupted runs resume with nothing lost; non-finite losses are caught and named; bad output dirs."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from lightning.pytorch import Callback

from harness.reliability import NonFiniteLossError
from harness.resume import load_resume
from harness.train import OutputDirError, run_training
from tests.test_train import compose_cfg

BASE = ["model=tiny", "trainer=cpu", "trainer.max_steps=30", "trainer.window=5", "trainer.val_every=0",
        "trainer.warmup_steps=2", "trainer.ckpt_every=10"]


class SignalAt(Callback):
    """Sends a real signal to this process at the end of a given step."""

    def __init__(self, step: int, sig=signal.SIGTERM):
        self.step, self.sig = step, sig

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.sig)


class PoisonAt(Callback):
    """Turns the model's weights into NaN after a given step."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.lm_head.weight.fill_(float("nan"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path, sig):
    full = run_training(compose_cfg(*BASE, "logger=wandb"), tmp_path / "full")
    part = run_training(compose_cfg(*BASE, "logger=wandb"), tmp_path / "part", extra_callbacks=(SignalAt(13, sig),))
    assert part["status"] == "interrupted" and part["stopped_by"] == signal.Signals(sig).name
    stopped = part["steps_done"]
    assert 13 <= stopped < 30 and (tmp_path / "part" / "checkpoints" / "last.ckpt").exists()
    assert signal.getsignal(sig) is not None  # handlers restored

    cfg, previous = load_resume(tmp_path / "part")
    resumed = run_training(cfg, tmp_path / "part", previous=previous)
    saved = json.loads((tmp_path / "part" / "results.json").read_text())
    assert saved["status"] == "completed" and saved["steps_done"] == 30 and saved["segments"] == 2
    # every step exactly once, and the same losses as the uninterrupted run
    assert len(saved["loss_curve"]) == 30
    diff = max(abs(a - b) for a, b in zip(saved["loss_curve"], full["loss_curve"]))
    assert diff < 1e-4, diff
    assert len(saved["segment_warmups_s"]) == 2
    # the same W&B run, continued
    assert resumed["wandb"]["id"] == part["wandb"]["id"]
    runs = sorted((tmp_path / "part" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(part["wandb"]["id"] in r.name for r in runs)


def test_resume_needs_a_checkpoint(tmp_path):
    run_training(compose_cfg(*BASE[:-1], "trainer.max_steps=6", "logger=none"), tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="no checkpoints/last.ckpt"):
        load_resume(tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="not a harness run directory"):
        load_resume(tmp_path / "nothing")


def test_nan_loss_stops_the_run_and_names_the_step(tmp_path):
    with pytest.raises(NonFiniteLossError) as e:
        run_training(compose_cfg(*BASE, "logger=wandb", "accel=naive"), tmp_path, extra_callbacks=(PoisonAt(7),))
    msg = str(e.value)
    assert "at step 7" in msg and "'naive'" in msg and "last finite loss" in msg and "at step 6" in msg
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["status"] == "failed" and saved["nonfinite_loss"]["step"] == 7
    assert saved["steps_done"] <= 10  # stopped at the first window boundary after it


def test_nan_loss_can_warn_only(tmp_path):
    res = run_training(compose_cfg(*BASE, "logger=none", "trainer.on_nonfinite=warn"), tmp_path,
                       extra_callbacks=(PoisonAt(7),))
    assert res["status"] == "nonfinite" and res["steps_done"] == 30 and res["nonfinite_loss"]["step"] == 7


def test_unwritable_output_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OutputDirError, match="cannot write the output directory"):
        run_training(compose_cfg(*BASE, "logger=none"), blocker / "run")


KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
os.environ.setdefault("WANDB_MODE", "offline")
from lightning.pytorch import Callback
from tests.test_train import compose_cfg
from harness.train import run_training

class KillAt(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 17:
            os._exit(9)  # no cleanup at all, like SIGKILL

run_training(compose_cfg(*{base!r}, "logger=wandb"), {run!r}, extra_callbacks=(KillAt(),))
"""


def test_a_killed_run_resumes_from_its_last_checkpoint_without_logging_a_step_twice(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    from harness.loggers import ResumableWandbLogger, last_logged_step

    root = str(Path(__file__).resolve().parents[1])
    run = tmp_path / "killed"
    script = KILL_SCRIPT.format(root=root, base=BASE, run=str(run))
    # its own W&B service, as a separate job would have (not this test process's, which it would inherit)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": root})
    assert r.returncode == 9, r.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "running"
    assert (run / "checkpoints" / "last.ckpt").exists()
    logged_before = last_logged_step(run)
    assert logged_before is not None and logged_before > 10  # logged past the step-10 checkpoint

    sent = []
    real = ResumableWandbLogger.__mro__[1].log_metrics
    monkeypatch.setattr(ResumableWandbLogger.__mro__[1], "log_metrics",
                        lambda self, metrics, step=None: (sent.append(step), real(self, metrics, step)))
    cfg, previous = load_resume(run)
    res = run_training(cfg, run, previous=previous)
    full = run_training(compose_cfg(*BASE, "logger=none"), tmp_path / "full")
    assert res["status"] == "completed" and len(res["loss_curve"]) == 30
    assert max(abs(a - b) for a, b in zip(res["loss_curve"], full["loss_curve"])) < 1e-4
    sent_steps = [s for s in sent if s is not None]
    assert sent_steps and min(sent_steps) > logged_before  # nothing the killed run already sent
    assert res["wandb"]["id"] == previous["wandb"]["id"]
