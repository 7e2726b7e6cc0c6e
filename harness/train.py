"""Training entry point: ``python -m harness.train [group=option ...] [key=value ...]`` (or ``harness-train``).

A Hydra app (``--help`` lists the methods, models, data and the keys people change most; harness.cli).
It builds the model, applies the acceleration method chosen by ``accel=...`` (harness.accel), checks
every op it patched against float64 (harness.gate), trains it with Lightning, logs throughput to W&B
(offline by default) and writes ``results.json`` into the run directory (harness.results): one run,
step by step, is harness.training. ``resume=<run dir>`` continues or extends a run in its own
directory (harness.resume).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.markup import escape

import kernels
from harness.accel import AccelError, check_accel
from harness.availability import method_unavailable_message
from harness.build import gpu_here
from harness.cli import EXIT_INTERRUPTED, UsageError, fail, run_app, split_argv, wants_help
from harness.config import CONF_DIR, ConfigError, validate  # also registers the structured-config schema
from harness.console import RunConsole
from harness.data import DataError
from harness.fallback import as_compiled
from harness.memory import MemoryEstimateError, check_step_memory
from harness.resume import (ResumeError, load_resume, override_value, record_failure, resume_command_line,
                            resume_request)
from harness.outcomes import OutputDirError


def validate_with_data(cfg: DictConfig) -> None:
    """Config ranges plus the cheap data checks (a missing text file) that need no corpus build, and
    whether the method can run on this machine."""
    validate(cfg)
    if cfg.data.name == "text" and not Path(str(cfg.data.path)).expanduser().is_file():
        raise DataError(f"data.path={cfg.data.path!r}: no such file (data=text needs an existing text file)")
    a = as_compiled(cfg.accel, bool(cfg.compile_model))  # the loss method that runs (harness.fallback)
    took = "" if a is cfg.accel else (f"with compile_model=true the loss method is accel.compiled_loss_method="
                                      f"{a.loss_method!r} (harness/fallback.py): ")
    msg = method_unavailable_message(str(a.name), str(a.method), dict(a.options or {}), a.get("loss_method"),
                                     list(a.patch), a.get("model_patch"))
    if msg:
        raise UsageError(took + msg)
    try:
        check_accel(str(a.method), list(a.patch), str(a.loss_form), a.get("loss_method"))  # exit 2, no directory
    except AccelError as exc:
        raise AccelError(took + str(exc)) from None
    check_step_memory(cfg, gpu_here(cfg))  # MemoryEstimateError (exit 2) when a step cannot fit; the run warns near it


def _user_error(exc: BaseException) -> bool:
    """A mistake in what the user asked for (said in one paragraph), not a failure of the run."""
    return isinstance(exc, (AccelError, ConfigError, DataError, UsageError, ResumeError, OutputDirError,
                            MemoryEstimateError,
                            kernels.MethodUnavailableError, kernels.UnknownMethodError))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    previous = None
    run_dir = Path(hc.runtime.output_dir)
    single = hc.mode != RunMode.MULTIRUN
    if cfg.resume:
        more = override_value(list(hc.overrides.task), "trainer.max_steps")
        try:
            cfg, previous = load_resume(Path(cfg.resume), int(more) if more is not None else None)
        except Exception as exc:
            if single and (_user_error(exc) or isinstance(exc, FileNotFoundError)):
                fail(str(exc))
            raise
        run_dir = Path(cfg.resume)
        done = previous.get("steps_done")
        what = (f"extending it to {cfg.trainer.max_steps} steps" if previous.get("status") in ("completed", "nonfinite")
                else f"continuing its {previous.get('status')} run" + (f" (stopped at step {done})" if done else ""))
        # through the run's console: on stderr and in the run's train.log, which the resumed segment appends to
        RunConsole().print(f"[bold]harness[/]: resumed {escape(str(run_dir))} from checkpoints/last.ckpt with its "
                           f"saved config, {what}")
    group = cfg.logger.group
    if group is None and hc.mode == RunMode.MULTIRUN:
        group = Path(hc.sweep.dir).name
    if hc.mode == RunMode.MULTIRUN and _distributed(cfg):
        # Lightning's DDP starts the other ranks by re-running this command line, which in a sweep
        # would re-run the whole sweep: run each job as its own single run in its own job directory
        _run_job_in_subprocess(list(hc.overrides.task), run_dir, group)
        return
    # here, once the config is accepted: Lightning takes seconds to import, which a refusal need not wait for
    from harness.training import run_training

    try:
        results = run_training(cfg, run_dir, group=group, previous=previous)
    except Exception as exc:
        # a sweep goes on past a failed job (Hydra reports it at the end); its results.json says why
        record_failure(run_dir, cfg, exc)
        if single and _user_error(exc):
            fail(str(exc))  # one paragraph, exit status 2, no traceback
        raise
    if results.get("status") == "interrupted":
        sys.exit(EXIT_INTERRUPTED)  # a script can tell the run did not finish (it says how to resume)


def _distributed(cfg: DictConfig) -> bool:
    devices = str(cfg.trainer.devices)
    return int(cfg.trainer.num_nodes) > 1 or (devices.isdigit() and int(devices) > 1) or devices in ("-1", "auto")


def _run_job_in_subprocess(overrides: list[str], run_dir: Path, group: str) -> None:
    cmd = [sys.executable, "-m", "harness.train", *overrides, f"logger.group={group}", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, check=True, cwd=os.getcwd())


def main() -> None:
    argv = sys.argv[1:]
    if not wants_help(argv) and resume_request(split_argv(argv)[1]):
        # into the run's own directory, checked first: a finished run is left untouched (exit 0)
        sys.argv[1:] = resume_command_line(argv)
        try:
            hydra_main()
        except KeyboardInterrupt:  # interrupted again: recorded, and said where it stopped
            sys.exit(EXIT_INTERRUPTED)
        return
    run_app(hydra_main, "config", validate_with_data)


if __name__ == "__main__":
    main()
