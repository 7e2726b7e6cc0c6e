"""A non-editable install carries the Hydra configs, and its commands work from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_sources(dst: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "build", "*.egg-info", "outputs",
                                  "wandb", ".venv", ".git")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    for name in ("harness", "kernels", "models", "conf", "csrc"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, dst / name, ignore=skip)


@pytest.mark.slow
def test_installed_package_runs_from_any_directory(tmp_path):
    src, site, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    src.mkdir()
    elsewhere.mkdir()
    _copy_sources(src)  # a copy: building in the checkout would leave build/ and *.egg-info behind
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (site / "harness" / "conf" / "config.yaml").is_file()
    assert (site / "harness" / "conf" / "accel" / "torch.yaml").is_file()
    assert (site / "harness" / "conf" / "hydra" / "launcher" / "slurm.yaml").is_file()
    packages = {p.parent.relative_to(ROOT) for top in ("harness", "kernels", "models")
                for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert [str(p) for p in sorted(packages) if not any((site / p).glob("*.py"))] == []  # every package ships

    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("HYDRA_FULL_ERROR", None)

    def run(*cmd):
        return subprocess.run(list(cmd), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    r = run(sys.executable, "-m", "harness.train", "--help")  # its configs: the installed copy (CONF_DIR)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "accel=" in r.stdout and "gpt2s" in r.stdout and f"Configs: {site / 'harness' / 'conf'}\n" in r.stdout
    r = run(str(site / "bin" / "harness-train"), "--cfg", "job", "model=tiny")  # through hydra.main itself
    assert r.returncode == 0, r.stderr[-2000:]
    assert "name: tiny" in r.stdout
    r = run(str(site / "bin" / "harness-study"), "--help")
    assert r.returncode == 0 and "study.methods" in r.stdout, r.stderr[-2000:]
    r = run(str(site / "bin" / "harness-bench"), "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not any(elsewhere.iterdir())  # nothing written where the commands ran
