"""The run's metrics logger (W&B, Lightning's CSV logger, or none), and W&B logging that survives a
hard kill: no step is logged twice when a run resumes.

The logger records the last step it sent in ``<run dir>/wandb-progress.json`` (a tiny atomic write per
logging interval). A run resumed from an earlier checkpoint re-trains the steps after it (with the
same data, so the same values) but does not send them again: metrics for steps up to the recorded one
are dropped, the rest continue the same W&B run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

from lightning.pytorch.loggers import WandbLogger

from harness.results import atomic_write_text

PROGRESS_FILE = "wandb-progress.json"


def last_logged_step(run_dir: Path) -> Optional[int]:
    try:
        return int(json.loads((Path(run_dir) / PROGRESS_FILE).read_text())["last_logged_step"])
    except (OSError, ValueError, KeyError):
        return None


class ResumableWandbLogger(WandbLogger):
    def __init__(self, *args, progress_dir: Path, skip_through_step: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._progress_path = Path(progress_dir) / PROGRESS_FILE
        self._skip_through = skip_through_step
        self._last: Optional[int] = None

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        if step is not None and self._skip_through is not None and step <= self._skip_through:
            return  # already sent by the run this one resumes
        super().log_metrics(metrics, step)
        if step is not None and step != self._last:
            self._last = step
            atomic_write_text(self._progress_path, json.dumps({"last_logged_step": step}))


def wandb_mode(requested: str) -> str:
    """auto: WANDB_MODE if set, online if an API key is configured, else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if "api.wandb.ai" in netrc.read_text():
            return "online"
    except OSError:
        pass
    return "offline"


def make_logger(logger_cfg, run_dir: Path, run_name: str, group: Optional[str], config: dict,
                wandb_id: Optional[str] = None):
    """The logger ``logger.name`` asks for (None for ``none``); a W&B run resumed by id continues."""
    name = logger_cfg.name
    if name == "none":
        return None
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(run_dir), name="csv", version="")
    return ResumableWandbLogger(
        progress_dir=run_dir,
        skip_through_step=last_logged_step(run_dir) if wandb_id else None,
        project=logger_cfg.project,
        name=run_name,
        group=group,
        save_dir=str(run_dir),
        dir=str(run_dir),
        mode=wandb_mode(logger_cfg.mode),
        tags=list(logger_cfg.tags) or None,
        config=config,
        job_type="train",
        **({"id": wandb_id, "resume": "allow"} if wandb_id else {}),
    )
