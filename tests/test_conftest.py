"""The test summary (tests/conftest.py): GPU skips counted in one line, not listed one by one; the GPU tests
that took the most memory named."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import GPU_SKIP, gpu_peaks, gpu_skips

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


def test_gpu_peaks_names_the_largest_first():
    gib = 2**30
    reports = [SimpleNamespace(nodeid=f"t{i}", user_properties=[("other", 9 * gib), ("gpu_peak_bytes", i * gib)])
               for i in (3, 31, 1, 7)] + [SimpleNamespace(nodeid="cpu", user_properties=[])]
    assert gpu_peaks(reports, top=2) == [(31 * gib, "t31"), (7 * gib, "t7")]
    assert gpu_peaks(reports[-1:]) == []
