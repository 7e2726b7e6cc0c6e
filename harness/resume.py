"""Continuing an interrupted run, extending a finished one, and marking a run that failed.

``resume=<run dir>`` continues a run with the config it saved in its ``results.json``, from its
``checkpoints/last.ckpt``, in its own directory (Hydra's run directory is pointed at it, and nothing
else is created). A finished run (``completed``, or ``nonfinite`` under ``trainer.on_nonfinite=warn``)
is left alone, unless ``trainer.max_steps`` asks for more steps than it has done: then it is extended,
its learning-rate schedule kept (``trainer.lr_decay_steps`` is pinned to the original length, so the
steps past it train at the final learning rate). ``trainer.max_steps`` is the only override a resume
takes; any other is refused, since it would silently not apply to the saved config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from harness.cli import fail, is_multirun, split_argv
from harness.config import TrainConfig, validate
from harness.gate import GateError
from harness.outcomes import NonFiniteLossError
from harness.results import read_json, write_json

#: statuses of a run that has done all its steps
FINISHED = ("completed", "nonfinite")
#: the overrides a resume takes (beside resume= itself)
RESUME_OVERRIDES = ("trainer.max_steps",)


class ResumeError(ValueError):
    """resume= cannot do what was asked (the message says why and what would work)."""


class RunFinished(Exception):
    """resume= names a run that has done all its steps: nothing to do, nothing is changed."""


def load_resume(run_dir: Path, max_steps: Optional[int] = None) -> tuple[DictConfig, dict]:
    """The config and results of a run directory, to continue it where it stopped (or, with a
    ``max_steps`` above the steps it has done, to extend a finished run). Raises RunFinished for a
    finished run with nothing more to do, FileNotFoundError / ResumeError when it cannot resume."""
    run_dir = Path(run_dir)
    results_path, ckpt = run_dir / "results.json", run_dir / "checkpoints" / "last.ckpt"
    if not results_path.is_file():
        raise FileNotFoundError(f"resume={run_dir}: no results.json there, so it is not a harness run directory")
    previous = read_json(results_path)
    if not isinstance(previous.get("config"), dict):
        raise ResumeError(f"resume={run_dir}: its results.json holds no saved config (status "
                          f"{previous.get('status')!r}), so there is nothing to resume it with")
    status = previous.get("status")
    saved = {k: v for k, v in previous["config"].items() if k not in ("env", "precision_resolved")}
    old_max = int(saved.get("trainer", {}).get("max_steps") or TrainConfig().trainer.max_steps)
    done = int(previous.get("steps_done") or 0)
    if max_steps is not None and max_steps <= done:
        raise ResumeError(f"resume={run_dir} trainer.max_steps={max_steps}: the run has already done {done} steps; "
                          f"to train it further give trainer.max_steps above {done}")
    if status in FINISHED and (max_steps is None or max_steps == old_max):
        raise RunFinished(
            f"{run_dir} is a finished run ({status}, {done} of {old_max} steps): nothing to do, nothing was changed. "
            f"To train it further: resume={run_dir} trainer.max_steps=N with N above {done}"
        )
    if not ckpt.is_file():
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("*")) if (run_dir / "checkpoints").is_dir() else []
        raise FileNotFoundError(
            f"resume={run_dir}: no checkpoints/last.ckpt to resume from (found: {', '.join(have) or 'nothing'}); "
            "runs save one on a graceful stop and every trainer.ckpt_every steps"
        )
    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
    cfg.resume = str(run_dir)
    if max_steps is not None and max_steps != old_max:
        if cfg.trainer.lr_decay_steps is None:
            cfg.trainer.lr_decay_steps = old_max  # the schedule the run was trained with, unchanged
        cfg.trainer.max_steps = int(max_steps)
        validate(cfg)
    return cfg, previous


def _quote(value: str) -> str:
    """A Hydra override value that stays one string whatever its characters."""
    return "'" + value.replace("'", "\\'") + "'"


def resume_request(args: list[str]) -> Optional[str]:
    """The run directory of a ``resume=...`` override on the command line (None: not a resume)."""
    for a in args:
        key, sep, value = a.partition("=")
        if sep and key.lstrip("+") == "resume" and value not in ("", "null"):
            return value.strip("'\"")
    return None


def resume_command_line(argv: list[str]) -> list[str]:
    """Check a ``resume=<run>`` command line before Hydra runs and return the one Hydra gets: the run's
    own directory as Hydra's run directory (no new directory, the log appended to the run's train.log,
    its .hydra/ left as the first segment wrote it). Exits 0 for a finished run (nothing changed) and
    2 with a clear message for anything that cannot resume."""
    flags, args = split_argv(argv)
    if is_multirun(flags):
        fail("resume= continues one run: it cannot be part of a sweep (-m)")
    run_dir, max_steps, refused, hydra_args = None, None, [], []
    for a in args:
        key, _, value = a.partition("=")
        key = key.lstrip("+")
        if key in ("hydra.run.dir", "hydra.output_subdir"):
            continue  # set below, to the run itself (Lightning's DDP ranks re-run the command with them)
        if key.startswith(("hydra.", "hydra/")):
            hydra_args.append(a)  # Hydra's own settings (logging, job name): not the run's config
        elif key == "resume":
            run_dir = value.strip("'\"")
        elif key == "trainer.max_steps":
            try:
                max_steps = int(value)
            except ValueError:
                fail(f"config value trainer.max_steps={value} has the wrong type: trainer.max_steps takes an integer")
        else:
            refused.append(a)
    if refused:
        fail(f"resume= continues a run with the config it saved, so it takes no override but "
             f"{', '.join(RESUME_OVERRIDES)}=N (to train it to N steps); refused: {' '.join(refused)}. "
             "For another configuration start a new run.")
    path = Path(run_dir).expanduser().resolve()
    try:
        load_resume(path, max_steps)
    except RunFinished as done:
        print(f"harness: {done}", file=sys.stderr)
        sys.exit(0)
    except (FileNotFoundError, ValueError) as exc:  # ResumeError, ConfigError
        fail(str(exc))
    out = [*flags, f"resume={_quote(str(path))}", f"hydra.run.dir={_quote(str(path))}", "hydra.output_subdir=null",
           *hydra_args]
    if max_steps is not None:
        out.append(f"trainer.max_steps={max_steps}")
    return out


def override_value(overrides: list[str], key: str) -> Optional[str]:
    """The value of ``key=...`` among Hydra's task overrides (None: not given)."""
    for o in overrides:
        k, sep, v = o.partition("=")
        if sep and k.lstrip("+") == key:
            return v
    return None


def record_failure(run_dir: Path, cfg: DictConfig, exc: BaseException) -> None:
    """Mark the run's results.json failed (gate, NaN), interrupted (KeyboardInterrupt: a signal before
    the run could record itself) or crashed, with the error, unless the run wrote its own final results; what a 'running' record already held (config, W&B id) is kept."""
    path = Path(run_dir) / "results.json"
    record = {"method": cfg.accel.name, "compile_model": bool(cfg.compile_model),
              "model": {"name": cfg.model.name}, "run_dir": str(run_dir)}
    try:
        if path.exists():
            existing = read_json(path)
            if existing.get("status") != "running":
                return
            record = existing
        record["status"] = ("failed" if isinstance(exc, (GateError, NonFiniteLossError))
                            else "interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed")
        record["error"] = f"{type(exc).__name__}: {exc}"
        write_json(path, record)
    except OSError:
        pass  # the directory itself is the problem (OutputDirError): nothing to write into
