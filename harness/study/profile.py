"""Where a study row's training step spends its time (``study.profile``, on by default on a GPU): one
eager step of each row split into the attention, the loss, the matmuls and the rest by
harness.breakdown, each with its Amdahl bound, for the report's table. A row that cannot be profiled
gets the error instead, never a crash of the study.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from harness.breakdown import profile_step
from harness.study.failures import free_memory, is_oom
from harness.study.plan import accel_for


def profile_on(cfg: DictConfig) -> bool:
    """study.profile, or (null) whether a GPU runs the study."""
    if cfg.study.profile is not None:
        return bool(cfg.study.profile)
    return torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")


def profile_row(cfg: DictConfig, method: str, variant: str = "") -> dict:
    """The breakdown of one step of the accel configuration ``method`` (as its ``variant`` runs), as a
    dict; {"error": ...} when it failed."""
    try:
        return profile_step(cfg, accel_for(method, variant)).as_dict()
    except Exception as exc:
        kind = "out of memory" if is_oom(exc) else type(exc).__name__
        return {"error": f"{kind}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
    finally:
        free_memory()
