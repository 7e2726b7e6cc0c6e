"""What ran where: device, versions, git revision (recorded in results.json and W&B)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Optional

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> Optional[str]:
    """HEAD's hash, with '-dirty' when tracked files differ from it; None outside a git checkout."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        if rev.returncode:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device: Optional[torch.device] = None) -> str:
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def switches() -> dict:
    """The HARNESS_* environment variables set for this process (kernel switches such as
    HARNESS_FLASH_GLUON_GROUPED or HARNESS_TRITON_DIRECT change what runs: a result says which were set)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("HARNESS_")}


def switches_text(env: dict) -> str:
    """", switches K=V ..." for a table's or report's header where any were set (``switches``), else ""."""
    sw = env.get("switches") or {}
    return ", switches " + " ".join(f"{k}={v}" for k, v in sw.items()) if sw else ""


def environment() -> dict:
    return {
        "device_name": device_name(),
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "lightning": _version("lightning"),
        "hydra": _version("hydra-core"),
        "wandb": _version("wandb"),
        "python": platform.python_version(),
        "git_revision": git_revision(),
        "switches": switches(),
    }
