"""Test setup: Triton's CPU interpreter where there is no GPU, offline W&B, a private data cache.

TRITON_INTERPRET must be set before anything imports triton (Lightning does), hence here, at import.
"""

from __future__ import annotations

import os
import tempfile

import torch

HAS_CUDA = torch.cuda.is_available()
if os.environ.get("PYTEST_XDIST_WORKER") and not HAS_CUDA:
    # one of several test processes (pytest-xdist, `make test`): one CPU thread each, not one per core each
    torch.set_num_threads(1)
#: the reason every gpu-marked test skips for without a GPU; the summary counts them in one line
GPU_SKIP = "needs a CUDA GPU"
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("HARNESS_CACHE", tempfile.mkdtemp(prefix="harness-cache-"))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI (CI=true): the property tests draw the same examples every run, so a submission's result does not
# depend on which random cases a run happened to draw; elsewhere they explore (new cases each run)
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def gpu_skips(skipped: list) -> int:
    """How many of the skipped test reports skipped for want of a GPU (the gpu marker's reason, or a
    ``skipif`` with the same reason)."""
    reasons = [r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in skipped]
    return sum(GPU_SKIP in reason for reason in reasons)


@pytest.fixture(autouse=True)
def gpu_memory(request):
    """On a GPU: each gpu-marked test's peak allocated memory kept as its report's ``gpu_peak_bytes``
    property (the summary names the largest), and its cached blocks handed back after it, so that test
    processes sharing the card (``-n 16``) do not each keep the most any of their tests once took."""
    if not (HAS_CUDA and "gpu" in request.keywords):
        yield
        return
    torch.cuda.reset_peak_memory_stats()
    yield
    request.node.user_properties.append(("gpu_peak_bytes", torch.cuda.max_memory_allocated()))
    torch.cuda.empty_cache()


def gpu_peaks(reports: list, top: int = 5) -> list[tuple[int, str]]:
    """(peak bytes, test id) of the ``top`` test reports with the largest ``gpu_peak_bytes``, largest first."""
    peaks = [(v, r.nodeid) for r in reports for k, v in getattr(r, "user_properties", ()) if k == "gpu_peak_bytes"]
    return sorted(peaks, reverse=True)[:top]


def pytest_terminal_summary(terminalreporter):
    # one line instead of a line per skipped GPU test (addopts -rfE lists failures and errors only)
    skipped = terminalreporter.stats.get("skipped", [])
    gpu = gpu_skips(skipped)
    if skipped:
        terminalreporter.write_line(f"{gpu} of {len(skipped)} skipped tests need a CUDA GPU"
                                    + ("" if HAS_CUDA else " (none here)"))
    # (the property is set in the fixture's teardown: only the teardown report holds it, filed under "")
    reports = [r for rs in terminalreporter.stats.values() for r in rs if getattr(r, "when", None) == "teardown"]
    for peak, nodeid in gpu_peaks(reports):
        terminalreporter.write_line(f"GPU peak {peak / 2**30:6.2f} GiB  {nodeid}")


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


@pytest.fixture
def ck():
    """The Triton cross-entropy's row kernels and plans (imported late: after TRITON_INTERPRET is set)."""
    from kernels.methods.triton.cross_entropy import launch as cross_entropy_kernels

    return cross_entropy_kernels
