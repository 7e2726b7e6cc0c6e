"""Results files, written atomically: a reader never sees half a file, a crash never leaves one."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a failed run's numbers stay visible and valid."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def atomic_write_text(path: Path | str, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path | str, data: dict) -> None:
    atomic_write_text(path, json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def read_json(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())
