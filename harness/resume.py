"""Continuing an interrupted run, and marking a run that failed."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.results import read_json, write_json


def load_resume(run_dir: Path) -> tuple[DictConfig, dict]:
    """The config and results of an interrupted run directory, to continue it where it stopped."""
    from harness.config import TrainConfig

    run_dir = Path(run_dir)
    results_path, ckpt = run_dir / "results.json", run_dir / "checkpoints" / "last.ckpt"
    if not results_path.is_file():
        raise FileNotFoundError(f"resume={run_dir}: no results.json there, so it is not a harness run directory")
    if not ckpt.is_file():
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("*")) if (run_dir / "checkpoints").is_dir() else []
        raise FileNotFoundError(
            f"resume={run_dir}: no checkpoints/last.ckpt to resume from (found: {', '.join(have) or 'nothing'}); "
            "runs save one on a graceful stop and every trainer.ckpt_every steps"
        )
    previous = read_json(results_path)
    saved = {k: v for k, v in previous["config"].items() if k not in ("env", "precision_resolved")}
    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
    cfg.resume = str(run_dir)
    return cfg, previous


def record_failure(run_dir: Path, cfg: DictConfig, exc: BaseException) -> None:
    """Mark the run's results.json failed (gate, NaN) or crashed, with the error, unless the run wrote
    its own final results; what a 'running' record already held (config, W&B id) is kept."""
    from harness.gate import GateError
    from harness.reliability import NonFiniteLossError

    path = Path(run_dir) / "results.json"
    record = {"method": cfg.accel.name, "compile_model": bool(cfg.compile_model),
              "model": {"name": cfg.model.name}, "run_dir": str(run_dir)}
    try:
        if path.exists():
            existing = read_json(path)
            if existing.get("status") != "running":
                return
            record = existing
        record["status"] = "failed" if isinstance(exc, (GateError, NonFiniteLossError)) else "crashed"
        record["error"] = f"{type(exc).__name__}: {exc}"
        write_json(path, record)
    except OSError:
        pass  # the directory itself is the problem (OutputDirError): nothing to write into
