"""Interrupted runs resume with nothing lost; non-finite losses are caught and named; bad output dirs."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from lightning.pytorch import Callback

from harness.outcomes import NonFiniteLossError, OutputDirError
from harness.reliability import GracefulStop
from harness.resume import load_resume
from harness.training import run_training
from tests.test_train import compose_cfg, run_cli

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


# SIGTERM takes the same graceful path as Ctrl+C (SIGINT): in the slow set
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGINT], ids=["SIGTERM", "SIGINT"])
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
    assert_wandb_history_continues(runs)


def wandb_records(run_folder):
    """The records of an offline W&B run folder, read back by W&B's own transaction-log reader."""
    import json as _json
    import subprocess
    import sys

    files = list(run_folder.glob("*.wandb"))
    assert len(files) == 1, files
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(files[0])],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        pytest.skip(f"this wandb has no transaction-log reader (wandb leet inspect): {r.stderr[-300:]}")
    return [_json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def assert_wandb_history_continues(folders):
    """Each later folder of one W&B run is marked resumed and continues the step counter (_step) of the
    one before, so syncing them all appends rather than overwrites."""
    last = -1
    for i, folder in enumerate(folders):
        records = wandb_records(folder)
        run = next(r["run"] for r in records if r["type"] == "run")
        steps = [r["history"]["item"]["_step"] for r in records if r["type"] == "history"]
        assert steps and steps == sorted(steps), steps
        assert bool(run.get("resumed")) == (i > 0), (folder, run.get("resumed"))
        assert steps[0] == last + 1, (folder, steps, last)  # no gap, no overlap
        last = steps[-1]


def _snapshot(root):
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow  # three CLI runs (~50 s); the in-process resume tests stay in the default set
def test_resume_cli_leaves_a_finished_run_alone_and_extends_it_in_place(tmp_path, capsys, monkeypatch):
    from harness.resume import resume_command_line

    # each command is a job of its own, with its own W&B service (which has flushed when it exits)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    run, cwd = tmp_path / "run", tmp_path / "cwd"
    cwd.mkdir()
    r = run_cli(*BASE, "trainer.max_steps=20", "logger=wandb", f"hydra.run.dir={run}", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads((run / "results.json").read_text())
    assert first["status"] == "completed" and not any(cwd.iterdir())
    before = _snapshot(run)
    first_log = (run / "train.log").read_text()

    r = run_cli(f"resume={run}", cwd=cwd)  # finished: says so, changes nothing
    assert r.returncode == 0, r.stderr[-3000:]
    assert "is a finished run (completed, 20 of 20 steps)" in r.stderr and "trainer.max_steps=N" in r.stderr
    assert _snapshot(run) == before and not any(cwd.iterdir())
    # checked before Hydra starts, as main() does: an override that would not apply is refused, and a
    # failed resume creates nothing either
    for argv, message in (([f"resume={run}", "trainer.max_steps=40", "accel=naive"], "refused: accel=naive"),
                          ([f"resume={tmp_path / 'nothing'}"], "not a harness run directory")):
        with pytest.raises(SystemExit) as e:
            resume_command_line(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert _snapshot(run) == before and not any(cwd.iterdir())

    r = run_cli(f"resume={run}", "trainer.max_steps=30", cwd=cwd)  # extended, in its own directory
    assert r.returncode == 0, r.stderr[-3000:]
    assert "extending it to 30 steps" in r.stderr
    assert not any(cwd.iterdir())
    assert all(_snapshot(run)[p] == before[p] for p in before if ".hydra" in p.parts)  # as the run wrote it
    saved = json.loads((run / "results.json").read_text())
    assert saved["status"] == "completed" and saved["steps_done"] == 30 and saved["segments"] == 2
    assert len(saved["loss_curve"]) == 30 and saved["loss_curve"][:20] == first["loss_curve"]
    assert saved["config"]["trainer"]["max_steps"] == 30 and saved["config"]["trainer"]["lr_decay_steps"] == 20
    log = (run / "train.log").read_text()  # the run's own log, both segments
    assert log.startswith(first_log) and "`max_steps=20` reached" in first_log and "`max_steps=30` reached" in log
    runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(first["wandb"]["id"] in p.name for p in runs)
    assert_wandb_history_continues(runs)
    for noise in ("LeafSpec", "litlogger", "anonymous setting", "v_num", "exists and is not empty"):
        assert noise not in r.stderr + r.stdout
    assert f"wandb sync {runs[0]} {runs[1]}" in r.stderr


def test_extending_a_run_keeps_its_learning_rate_schedule(tmp_path):
    from harness.config import to_container
    from harness.results import write_json

    # a finished run's directory, as far as resume reads it
    config = to_container(compose_cfg(*BASE, "trainer.max_steps=20", "logger=none"))
    write_json(tmp_path / "results.json", {"status": "completed", "steps_done": 20, "config": config})
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    more, _ = load_resume(tmp_path, max_steps=40)
    assert more.trainer.max_steps == 40 and more.trainer.lr_decay_steps == 20
    from harness.task import warmup_cosine_lr

    t = more.trainer
    final = warmup_cosine_lr(20, t.lr, t.lr_warmup_steps, t.lr_decay_steps, t.min_lr_ratio)
    assert final == pytest.approx(t.lr * t.min_lr_ratio)  # steps past the schedule keep its final lr
    with pytest.raises(ValueError, match="already done 20 steps"):
        load_resume(tmp_path, max_steps=20 - 5)
    from harness.resume import RunFinished

    with pytest.raises(RunFinished):
        load_resume(tmp_path)


def test_resume_needs_a_checkpoint(tmp_path):
    run_training(compose_cfg(*BASE[:-1], "trainer.max_steps=6", "logger=none"), tmp_path / "r")
    # a finished run resumes only to be extended (else there is nothing to do), and that needs a checkpoint
    with pytest.raises(FileNotFoundError, match="no checkpoints/last.ckpt"):
        load_resume(tmp_path / "r", max_steps=12)
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
from tests.test_train import compose_cfg, run_cli
from harness.training import run_training

class KillAt(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 17:
            os._exit(9)  # no cleanup at all, like SIGKILL

run_training(compose_cfg(*{base!r}, "logger=wandb"), {run!r}, extra_callbacks=(KillAt(),))
"""


@pytest.mark.slow  # two training processes, one killed (~12 s)
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


def test_csv_logger_of_a_resumed_run_appends_to_the_run_s_metrics(tmp_path):
    import csv

    from harness.loggers import ResumableCSVLogger

    first = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    first.log_metrics({"train/loss": 3.0}, step=4)
    first.log_metrics({"train/loss": 2.5}, step=9)
    first.save()
    again = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="", resuming=True)
    again.log_metrics({"train/loss": 2.5}, step=9)  # re-trained after an earlier checkpoint: not again
    again.log_metrics({"train/loss": 2.0, "val/loss": 2.2}, step=14)
    again.save()
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), r["train/loss"], r["val/loss"]) for r in rows] == [
        (4, "3.0", ""), (9, "2.5", ""), (14, "2.0", "2.2")]
    fresh = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")  # a new run starts over
    with pytest.warns(UserWarning, match="will be deleted"):
        fresh.log_metrics({"train/loss": 1.0}, step=1)
    fresh.save()
    assert len((tmp_path / "csv" / "metrics.csv").read_text().splitlines()) == 2


def test_a_graceful_stop_saves_the_full_state_saying_so(tmp_path):
    # weights_only=False, explicitly: left unset, Lightning logs "`weights_only` was not set" at every stop
    saved = []
    trainer = type("T", (), {"save_checkpoint": lambda self, path, **kw: saved.append((path, kw))})()
    path = GracefulStop(tmp_path).save(trainer)
    assert saved == [(str(tmp_path / "last.ckpt"), {"weights_only": False})] and path == tmp_path / "last.ckpt"
