"""The test summary: GPU skips counted in one line (tests/conftest.py), not listed one by one."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import GPU_SKIP, gpu_skips

ROOT = Path(__file__).resolve().parents[1]


def _skipped(reason: str) -> SimpleNamespace:
    return SimpleNamespace(longrepr=("tests/test_x.py", 1, f"Skipped: {reason}"))


def test_gpu_skips_are_counted_apart_from_other_skips():
    reports = [_skipped(GPU_SKIP), _skipped(GPU_SKIP), _skipped("triton cannot run here")]
    assert gpu_skips(reports) == 2
    assert gpu_skips([]) == 0


def test_the_summary_lists_failures_and_errors_only():
    # (read as text: tomllib is Python 3.11+, the project takes 3.10)
    addopts = re.search(r'^addopts = "([^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1).split()
    assert "-rfE" in addopts and "-ra" not in addopts
