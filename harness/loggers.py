"""W&B logging that survives a hard kill: no step is logged twice when a run resumes.

The logger records the last step it sent in ``<run dir>/wandb-progress.json`` (a tiny atomic write per
logging interval). A run resumed from an earlier checkpoint re-trains the steps after it (with the
same data, so the same values) but does not send them again: metrics for steps up to the recorded one
are dropped, the rest continue the same W&B run.
"""

from __future__ import annotations

import json
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
