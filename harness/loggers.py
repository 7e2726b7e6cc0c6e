"""The run's metrics logger (W&B, Lightning's CSV logger, or none), and logging that survives a resume
and a hard kill: no step is logged twice, and a resumed W&B run continues the same run.

The W&B logger records the last training step it sent, and W&B's own step counter (``_step``), in
``<run dir>/wandb-progress.json`` (a tiny atomic write per logging interval). A run resumed from an
earlier checkpoint re-trains the steps after it (with the same data, so the same values) but does not
send them again: metrics for steps up to the recorded one are dropped. The resumed segment's W&B run
(same id, a new offline folder) starts its ``_step`` where the last segment's stopped and is marked
resumed, so syncing both folders (``wandb sync``) appends the second segment's history to the first
instead of overwriting it. The CSV logger appends to the run's ``csv/metrics.csv`` likewise.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Mapping, Optional

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from harness.results import atomic_write_text
from harness.wandb_auth import wandb_mode

PROGRESS_FILE = "wandb-progress.json"


def _progress(run_dir: Path) -> dict:
    try:
        data = json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def last_logged_step(run_dir: Path) -> Optional[int]:
    """The last training step the run's W&B logger sent (None: none recorded)."""
    try:
        return int(_progress(run_dir)["last_logged_step"])
    except (KeyError, TypeError, ValueError):
        return None


def next_wandb_step(run_dir: Path) -> Optional[int]:
    """W&B's ``_step`` for the next record of the run (None: none recorded)."""
    try:
        return int(_progress(run_dir)["next_wandb_step"])
    except (KeyError, TypeError, ValueError):
        return None


class ResumableWandbLogger(WandbLogger):
    """Lightning's W&B logger, resumable: ``skip_through_step`` drops metrics of steps an earlier
    segment already sent, ``start_step`` continues W&B's step counter where that segment stopped."""

    def __init__(self, *args, progress_dir: Path, skip_through_step: Optional[int] = None,
                 start_step: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            # Lightning passes anonymous=None, which W&B now warns about ("has no effect")
            self._wandb_init.pop("anonymous", None)
        self._progress_path = Path(progress_dir) / PROGRESS_FILE
        self._skip_through = skip_through_step
        self._start_step = start_step
        self._last: Optional[int] = skip_through_step
        self._written: Optional[dict] = None

    @property
    def experiment(self):
        run = super().experiment
        start, self._start_step = self._start_step, None
        if start is not None and hasattr(run, "step") and start > run.step:
            run.log({}, step=start, commit=False)  # the next record is _step=start: the history continues
        return run

    @rank_zero_only  # as Lightning's: the other ranks of a distributed run hold no W&B run
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        if step is not None and self._skip_through is not None and step <= self._skip_through:
            return  # already sent by the run this one resumes
        super().log_metrics(metrics, step)
        # after every record (validation logs a second one at a training step): the next segment's
        # W&B step must follow the last record, whatever its training step
        progress = {"last_logged_step": step if step is not None else self._last,
                    "next_wandb_step": int(self.experiment.step)}
        if progress != self._written:
            self._written = progress
            self._last = progress["last_logged_step"]
            atomic_write_text(self._progress_path, json.dumps(progress))


def make_logger(logger_cfg, run_dir: Path, run_name: str, group: Optional[str], config: dict,
                wandb_id: Optional[str] = None, resuming: bool = False):
    """The logger ``logger.name`` asks for (None for ``none``); a W&B run resumed by id continues."""
    name = logger_cfg.name
    if name == "none":
        return None
    if name == "csv":
        return ResumableCSVLogger(save_dir=str(run_dir), name="csv", version="", resuming=resuming)
    import wandb  # here: a heavy import that only logger=wandb needs

    mode = wandb_mode(logger_cfg.mode)
    extra: dict = {}
    settings: dict = {}
    if not {"WANDB_QUIET", "WANDB_SILENT"} & set(os.environ):  # (a user's own choice stands)
        settings["quiet"] = True  # no end-of-run panel of sparklines: the harness's done line says what counts
    if wandb_id:
        extra = {"id": wandb_id, "resume": "allow"}
        if mode == "offline":  # no server to say so: the record itself says it continues the run
            settings["resumed"] = True
    if settings:
        extra["settings"] = wandb.Settings(**settings)
    return ResumableWandbLogger(
        progress_dir=run_dir,
        skip_through_step=last_logged_step(run_dir) if wandb_id else None,
        start_step=next_wandb_step(run_dir) if wandb_id else None,
        project=logger_cfg.project,
        name=run_name,
        group=group,
        save_dir=str(run_dir),
        dir=str(run_dir),
        mode=mode,
        tags=list(logger_cfg.tags) or None,
        config=config,
        job_type="train",
        **extra,
    )


def _csv_last_step(path: Path) -> Optional[int]:
    try:
        with open(path, newline="") as f:
            steps = [int(float(row["step"])) for row in csv.DictReader(f) if row.get("step")]
        return max(steps) if steps else None
    except (OSError, KeyError, ValueError):
        return None


def _appending_writer(log_dir: str, resuming: bool):
    """Lightning's CSV writer, which deletes an existing metrics.csv; this one, resuming, appends to it
    (the rows of steps already written are dropped, as the W&B logger drops them)."""
    class _Writer(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:
            self._skip_through = None
            path = Path(self.metrics_file_path)
            if not (resuming and path.is_file()):
                super()._check_log_dir_exists()
                return
            with open(path, newline="") as f:
                self.metrics_keys = sorted(csv.DictReader(f).fieldnames or [])
            self._skip_through = _csv_last_step(path)

        def log_metrics(self, metrics_dict, step=None) -> None:
            if step is not None and self._skip_through is not None and step <= self._skip_through:
                return
            super().log_metrics(metrics_dict, step)

    return _Writer(log_dir=log_dir)


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSV logger (``<run dir>/csv/metrics.csv``); a resumed run appends to the file."""

    def __init__(self, *args, resuming: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._resuming = resuming

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _appending_writer(self.log_dir, self._resuming)
        return self._experiment
