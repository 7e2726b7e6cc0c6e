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


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (mode 0644, as any file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; results are read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path | str, data: dict) -> None:
    atomic_write_text(path, json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def read_json(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def running_record(cfg, config: dict, run_dir: Path, applied: dict, wandb_id) -> dict:
    """What a run writes before training: enough to resume it if it is killed outright."""
    return {
        "status": "running", "method": cfg.accel.name, "compile_model": bool(cfg.compile_model),
        "patched": applied, "model": config["model"], "data": config["data"], "run_dir": str(run_dir),
        "config": config, "wandb": {"id": wandb_id} if wandb_id else None,
    }


def final_record(cfg, *, status: str, failure, guard_event, stopped_by, steps_done: int, previous,
                 applied: dict, exact: bool, config: dict, env: dict, device: str, precision: str,
                 world_size: int, tokens_per_step: int, checksums: list, flops_per_token: float,
                 prepared: dict, gate: dict, summary: dict, curve: list, val_loss, run_dir: Path) -> dict:
    """The results of a run (results.json): one record, written in one place."""
    return {
        "status": status,
        "error": str(failure) if failure else None,
        "nonfinite_loss": guard_event,
        "stopped_by": stopped_by,
        "steps_done": steps_done,
        "resumed": bool(previous),
        "segments": ((previous or {}).get("segments") or 1) + (1 if previous else 0),
        "method": cfg.accel.name,
        "kernels_method": cfg.accel.method,
        "kernels_loss_method": cfg.accel.get("loss_method"),  # None: the loss (if patched) is kernels_method's
        "exact": exact,
        "patched": applied,
        "compile_model": bool(cfg.compile_model),
        "model": config["model"],
        "data": config["data"],
        "seed": cfg.seed,
        "device": device,
        "precision": precision,
        "world_size": world_size,
        "tokens_per_step": tokens_per_step * world_size,
        "rank_first_batch_checksums": checksums,
        "flops_per_token": flops_per_token,
        "method_prepare": prepared,
        "gate": gate,
        **summary,
        "final_train_loss": curve[-1][1] if curve else None,
        "final_val_loss": float(val_loss) if val_loss is not None else None,
        "loss_curve": [v for _, v in curve],
        "env": env,
        "run_dir": str(run_dir),
        "config": config,
    }
