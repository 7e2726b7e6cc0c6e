"""A study run that fails does not stop the study: an out-of-memory point is OOM, a failed gate or a
non-finite loss FAIL, anything else a CRASH with its traceback in the run's ``error.txt``; the run's
``results.json`` is closed with the verdict, its W&B run finished, and its memory released before the
next run.
"""

from __future__ import annotations

import gc
import json
import traceback
from pathlib import Path

import torch
from omegaconf import DictConfig
from rich.markup import escape

from harness.gate import GateError
from harness.outcomes import NonFiniteLossError
from harness.results import atomic_write_text, write_json
from harness.study.plan import Point
from harness.study.rows import StudyRow


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error: torch's own, or a RuntimeError (a failed gate included) that says so."""
    types = tuple(t for t in (getattr(torch.cuda, "OutOfMemoryError", None), getattr(torch, "OutOfMemoryError", None))
                  if isinstance(t, type))
    if types and isinstance(exc, types):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def record_failure(row: StudyRow, exc: BaseException, run_dir: Path, rnd: int, point: Point, console) -> None:
    """The row's status and reason from the error of its run (called inside the ``except``: a crash's
    traceback goes to the run's error.txt)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    rep = f"repeat {rnd}: " if rnd > 1 else ""
    if is_oom(exc):
        where = f" at T = {point.values['context']}" if "context" in point.values else \
            f" with {point.values['model']}" if "model" in point.values else ""
        row.status, row.reason = "OOM", f"{rep}out of memory{where} ({type(exc).__name__}: {first[:160]})"
    elif isinstance(exc, (GateError, NonFiniteLossError)):
        row.status, row.reason = "FAIL", rep + first
    else:
        row.status, row.reason = "CRASH", rep + first
        atomic_write_text(Path(run_dir) / "error.txt", traceback.format_exc())
    _close_record(Path(run_dir) / "results.json", row)
    where = f"{point.label}: " if point.label else ""  # (escaped: a label's [setting] is not markup)
    console.print(f"[red]study: {escape(where + row.label)} {row.status}: {escape(row.reason)}[/]")


def _close_record(path: Path, row: StudyRow) -> None:
    """A run the study stopped (an OOM, a failed gate, a crash) leaves the results.json it wrote before
    training saying "running": close it with the study's verdict, so that harness.report reads it so."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if res.get("status") == "running":
        status = {"OOM": "oom", "FAIL": "failed"}.get(row.status, "crashed")
        write_json(path, dict(res, status=status, error=row.reason))


def finish_wandb(cfg: DictConfig) -> None:
    """A run that raised leaves its W&B run open: close it, so that the next run starts its own."""
    if cfg.logger.name != "wandb":
        return
    import wandb  # here: a heavy import that only logger=wandb needs

    if wandb.run is not None:
        wandb.finish(exit_code=1)


def free_memory(force: bool = False) -> None:
    """Drop what the last run left (a GPU's cached blocks); on the CPU only after a failure (a full
    collection costs a fraction of a second there, and CPU runs are small)."""
    if force or torch.cuda.is_available():
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
