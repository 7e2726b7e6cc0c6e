"""What a run prints and writes: a readable progress bar and end-of-run lines, no third-party noise the
user cannot act on, results files readable by others, no tracked file ignored by git."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.console import done_message, quiet_third_party
from harness.progress import HarnessProgressBar, LineProgress, bar_metrics, human, progress_callback

ROOT = Path(__file__).resolve().parents[1]


def test_progress_bar_shows_readable_throughput():
    shown = bar_metrics({"train/loss": torch.tensor(3.14159), "train/tokens_per_s": torch.tensor(882_345.0),
                         "train/step_ms": torch.tensor(45.25), "train/mfu": torch.tensor(0.3123),
                         "val/loss": torch.tensor(2.5), "v_num": "ab12"})
    assert shown == {"loss": "3.142", "val_loss": "2.500", "tok/s": "882k", "step": "45.2ms", "mfu": "31.2%"}
    assert [human(v) for v in (950, 2710, 1_234_567, 12_500_000_000)] == ["950", "2.71k", "1.23M", "12.5G"]


def test_a_timing_only_method_shows_no_loss(tmp_path):
    # accel=floor (exact=False) logs a stand-in, not a loss: the bar and the done line must not show it
    logged = {"train/loss": torch.tensor(-0.019), "val/loss": torch.tensor(-0.02), "train/tokens_per_s": 5000.0}
    bar = HarnessProgressBar(refresh_rate=1, loss_computed=False)
    shown = bar.get_metrics(SimpleNamespace(callback_metrics=logged), None)
    assert shown == {"loss": "-", "val_loss": "-", "tok/s": "5k"}
    assert HarnessProgressBar(refresh_rate=1).get_metrics(SimpleNamespace(callback_metrics=logged), None)["loss"] == "-0.019"
    summary = SimpleNamespace(tokens_per_s=5000.0, windows=1, warmup_s=1.0)
    text = done_message({"final_train_loss": -0.019, "exact": False}, "floor", "CPU", summary, tmp_path, "none")
    assert "final loss n/a (timing only)" in text and "-0.019" not in text


def test_end_of_run_lines_round_the_loss_and_say_where_things_are(tmp_path):
    summary = SimpleNamespace(tokens_per_s=1234.5, windows=1, warmup_s=1.0)
    (tmp_path / "wandb" / "offline-run-20261204_000000-abc").mkdir(parents=True)
    results = {"final_train_loss": 3.171724319458008, "wandb": {"id": "abc", "mode": "offline"},
               "config": {"logger": {"project": "p"}}}
    text = done_message(results, "torch", "CPU", summary, tmp_path, "wandb")
    assert "median of 1 window)" in text and "final loss 3.1717," not in text and "final loss 3.1717" in text
    assert f"wandb sync {tmp_path / 'wandb' / 'offline-run-20261204_000000-abc'}" in text
    assert str(tmp_path / "results.json") in text
    assert "metrics.csv" in done_message(results, "torch", "CPU", summary, tmp_path, "csv")
    assert "no throughput" not in text and "NOISY" not in text


def test_end_of_run_lines_say_why_a_run_has_no_throughput_or_is_noisy(tmp_path):
    results = {"final_train_loss": 3.0, "steps_done": 3, "config": {"trainer": {"warmup_steps": 2, "window": 5}}}
    short = SimpleNamespace(tokens_per_s=None, windows=0, warmup_s=1.0)
    text = done_message(results, "flash", "CPU", short, tmp_path, "none")
    assert "n/a tokens/s" in text and "no throughput: 3 steps, the first 2 of them warm-up" in text
    assert "trainer.max_steps >= 4" in text  # 2 warm-up + half of a 5-step window
    stopped = {**results, "stopped_by": "SIGTERM"}  # (stopped early: more steps would not have been the answer)
    assert "no throughput" not in done_message(stopped, "flash", "CPU", short, tmp_path, "none")
    noisy = SimpleNamespace(tokens_per_s=1000.0, windows=3, warmup_s=1.0, noisy=True, step_ms_spread=1.23)
    text = done_message(results, "torch", "CPU", noisy, tmp_path, "none")
    assert "NOISY: step p90/p50 1.23 > 1.10, something else ran on the machine" in text and "no throughput" not in text


def test_third_party_noise_is_filtered_and_nothing_else(caplog):
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    quiet_third_party()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        quiet_third_party()  # the filter goes in front of whatever is set
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]
    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging ... litlogger")
        rank_zero_info("TPU available: False, using: 0 TPU cores")
        rank_zero_info("`Trainer.fit` stopped: `max_steps=3` reached.")
        rank_zero_info("`Trainer(limit_val_batches=1)` was configured so 1 batch will be used.")
    assert "litlogger" not in caplog.text and "TPU" not in caplog.text and "max_steps=3" in caplog.text
    assert "limit_val_batches" not in caplog.text


def test_wandb_logger_does_not_pass_the_deprecated_anonymous_setting(tmp_path):
    from harness.loggers import ResumableWandbLogger

    logger = ResumableWandbLogger(progress_dir=tmp_path, save_dir=str(tmp_path), mode="offline")
    assert "anonymous" not in logger._wandb_init  # W&B warns about it ("has no effect")


def test_results_files_are_readable_by_everyone(tmp_path):
    from harness.results import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "results.json", {"a": 1})
        (tmp_path / "other.txt").write_text("")  # any other output, as Hydra and W&B write theirs
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "results.json").stat().st_mode)
    assert mode == 0o644 == stat.S_IMODE((tmp_path / "other.txt").stat().st_mode)


def test_no_tracked_file_is_gitignored():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip("git is not usable here")
    assert r.stdout.split() == []


def test_the_harness_lines_go_to_the_run_log_as_plain_text_unwrapped(tmp_path, capsys):
    import logging

    from harness.console import RunConsole

    handler = logging.FileHandler(tmp_path / "train.log")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        console = RunConsole()
        line = "[bold]harness[/]: accel=[cyan]triton[/] " + "word " * 40 + "-> outputs/runs/x"
        console.print(line)
        RunConsole(quiet=True).print("[bold]harness[/]: from another rank")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    plain = "harness: accel=triton " + "word " * 40 + "-> outputs/runs/x"
    assert (tmp_path / "train.log").read_text() == plain + "\n"  # markup gone; a quiet console writes nothing
    assert capsys.readouterr().err.strip() == plain  # one line on stderr, not wrapped at 80 columns


def test_wandb_runs_end_without_their_panel_unless_the_user_chose(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from harness.loggers import make_logger

    cfg = OmegaConf.create({"name": "wandb", "mode": "offline", "project": "p", "tags": []})
    monkeypatch.delenv("WANDB_QUIET", raising=False)
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    settings = make_logger(cfg, tmp_path, "run", None, {})._wandb_init["settings"]
    assert settings.quiet is True and not settings.resumed
    resumed = make_logger(cfg, tmp_path, "run", None, {}, wandb_id="abc")._wandb_init["settings"]
    assert resumed.quiet is True and resumed.resumed is True  # both settings kept
    monkeypatch.setenv("WANDB_QUIET", "false")  # the user's own choice: left to W&B
    assert "settings" not in make_logger(cfg, tmp_path, "run", None, {})._wandb_init


def _fake_trainer(**kw):
    base = dict(global_step=0, max_steps=20, callback_metrics={}, is_global_zero=True, sanity_checking=False,
                num_training_batches=float("inf"), current_epoch=0, max_epochs=-1, state=SimpleNamespace(fn="fit"))
    return SimpleNamespace(**{**base, **kw})


def test_off_a_terminal_progress_is_plain_lines_every_window():
    import io

    out = io.StringIO()  # (not a terminal: isatty() is False)
    cb = progress_callback(5, stream=out)
    assert isinstance(cb, LineProgress)
    logged = {"train/loss": torch.tensor(3.14159), "train/tokens_per_s": torch.tensor(882_345.0)}
    for step in range(1, 21):
        cb._trainer = _fake_trainer(global_step=step, callback_metrics=logged)
        cb.on_train_batch_end(cb._trainer, None, None, None, step - 1)
    cb._trainer = _fake_trainer(global_step=20, callback_metrics={**logged, "val/loss": torch.tensor(2.5)})
    cb.on_validation_end(cb._trainer, None)
    lines = out.getvalue().splitlines()
    assert lines[:4] == [f"step {s}/20  loss 3.142  tok/s 882k" for s in (5, 10, 15, 20)]
    assert lines[4] == "validation at step 20: val_loss 2.500" and len(lines) == 5
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    floor = LineProgress(5, loss_computed=False, stream=out)
    floor._trainer = _fake_trainer(global_step=5, callback_metrics=logged)
    floor.on_train_batch_end(floor._trainer, None, None, None, 4)
    assert out.getvalue().splitlines()[-1] == "step 5/20  loss -  tok/s 882k"


def test_on_a_terminal_the_bar_counts_to_max_steps_and_a_resumed_one_starts_where_it_stopped():
    class Tty:
        def isatty(self):
            return True

    bar = progress_callback(5, stream=Tty())
    assert isinstance(bar, HarnessProgressBar)
    bar._trainer = _fake_trainer(global_step=10, max_steps=20)
    bar.train_progress_bar = bar.init_train_tqdm()
    bar.on_train_epoch_start(bar._trainer, None)
    assert bar.train_progress_bar.total == 20 and bar.train_progress_bar.n == 10  # not "10/?"
    bar._trainer = _fake_trainer(global_step=15, max_steps=20)
    bar.on_train_batch_end(bar._trainer, None, None, None, 4)  # (a resumed epoch's fifth batch: step 15)
    assert bar.train_progress_bar.n == 15
