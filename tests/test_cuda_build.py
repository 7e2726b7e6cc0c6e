"""The CUDA kernels compile with plain nvcc for sm_90 (no torch header needed): a build break fails CI."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
NVCC = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))


#: source -> whether ptxas reports each kernel's registers and spills (-Xptxas -v)
_SOURCES = {
    "softmax_kernels.cu": True, "softmax_tuning.cu": False, "softmax_tuning_persist.cu": False,
    # the cross-entropy kernels (csrc/cross_entropy/paths.cuh): the production dispatch and the sweep's
    # two translation units of launch variants
    "cross_entropy_kernels.cu": True, "cross_entropy_tuning.cu": True, "cross_entropy_tuning_split.cu": True,
}


#: the test that compiles a production source (the tuning tests name theirs in their parameter)
_PRODUCTION = {"test_kernels_compile_for_sm90_without_spills": "softmax_kernels.cu",
               "test_cross_entropy_kernels_compile_for_sm90_without_spills": "cross_entropy_kernels.cu"}


def _selected_sources(session) -> list[str]:
    """The sources the selected tests of this module compile (a deselected slow test's build would only
    take the cores from the others)."""
    wanted = set()
    for item in session.items:
        if item.path == Path(__file__):
            params = getattr(getattr(item, "callspec", None), "params", {})
            wanted.add(params.get("source") or _PRODUCTION.get(item.originalname))
    return [s for s in _SOURCES if s in wanted]


@pytest.fixture(scope="module")
def builds(request, tmp_path_factory):
    """The nvcc builds the selected tests need, started together (CI has two cores; one build at a time
    took minutes): source -> (the running process, its object file). Each test waits for its own."""
    out = tmp_path_factory.mktemp("nvcc")
    procs = {}
    for source in _selected_sources(request.session):
        obj = out / (source + ".o")
        flags = ["-Xptxas", "-v"] if _SOURCES[source] else []
        cmd = [NVCC, "-std=c++17", "-O3", "-arch=sm_90", *flags, "-c", str(CSRC / source), "-o", str(obj)]
        procs[source] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), obj)
    yield procs
    for proc, _ in procs.values():
        if proc.poll() is None:
            proc.kill()


def _finish(builds, source):
    proc, obj = builds[source]
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-4000:]
    return stderr, obj


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CI installs the CUDA toolkit's compiler)")
def test_kernels_compile_for_sm90_without_spills(builds):
    stderr, obj = _finish(builds, "softmax_kernels.cu")
    assert obj.stat().st_size > 0
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", stderr)]
    # No production kernel spills registers to local memory (the launch table picks none that does;
    # some tuning variants do, see the test below).
    assert spills and max(spills) == 0, f"a kernel spills {max(spills)} bytes to local memory"


@pytest.mark.slow  # the tuning variants (~65 s); the method's own kernels' compile check stays
@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CI installs the CUDA toolkit's compiler)")
@pytest.mark.parametrize("source", ["softmax_tuning.cu", "softmax_tuning_persist.cu"])
def test_tuning_variants_compile_for_sm90(builds, source):
    """The launch variants that `harness.bench cuda-sweep` times (some may spill: they are candidates)."""
    _, obj = _finish(builds, source)
    assert obj.stat().st_size > 0


def _kernel_resources(stderr):
    """(kernel, registers, spill store bytes) for every kernel in ptxas -v output."""
    out, name, spill = [], None, 0
    for line in stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, spill = m.group(1), 0
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and name:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out.append((name, int(m.group(1)), spill))
            name = None
    return out


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CI installs the CUDA toolkit's compiler)")
def test_cross_entropy_kernels_compile_for_sm90_without_spills(builds):
    stderr, obj = _finish(builds, "cross_entropy_kernels.cu")
    assert obj.stat().st_size > 0
    kernels = _kernel_resources(stderr)
    names = " ".join(k for k, _, _ in kernels)
    for kernel in ("ce_rows_kernel", "ce_stream_kernel", "scale_grad_kernel"):
        assert kernel in names, f"{kernel} was not compiled"
    spilling = [(k, r, s) for k, r, s in kernels if s]
    assert not spilling, f"kernels that spill registers to local memory: {spilling}"
    # the 512-thread packed kernels (hybrid rows; 16-bit register rows of 16385-32768) run two blocks per
    # SM: at most 64 registers
    hybrid = [(k, r) for k, r, _ in kernels if re.search(r"ce_rows_kernel.*Li512ELi1ELb1ELb0E", k) and r > 64]
    assert not hybrid, hybrid


@pytest.mark.slow  # the sweep's launch variants; the method's own kernels' compile check stays
@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CI installs the CUDA toolkit's compiler)")
@pytest.mark.parametrize("source", ["cross_entropy_tuning.cu", "cross_entropy_tuning_split.cu"])
def test_cross_entropy_tuning_variants_compile_for_sm90(builds, source):
    """The launch variants that `python -m harness.bench cuda-ce-sweep` times."""
    _, obj = _finish(builds, source)
    assert obj.stat().st_size > 0


def _device_headers():
    headers = sorted((CSRC / "softmax").glob("*.cuh")) + sorted((CSRC / "cross_entropy").glob("*.cuh"))
    assert len({p.parent.name for p in headers}) == 2, "no headers in csrc/softmax or csrc/cross_entropy"
    return headers


def test_kernel_sources_include_no_torch_header():
    names = ("softmax_kernels.cu", "softmax_kernels.h", "softmax_tuning.cu", "softmax_tuning_persist.cu",
             "softmax_tuning.h", "cross_entropy_kernels.cu", "cross_entropy_kernels.h", "cross_entropy_tuning.cu",
             "cross_entropy_tuning_split.cu", "cross_entropy_tuning.h")
    for path in [CSRC / name for name in names] + _device_headers():
        text = path.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), path.name


def test_device_headers_hold_no_host_launchers():
    """Kernel launches, occupancy queries and kernel attributes live in softmax/launch.cuh and
    cross_entropy/launch.cuh (included by the .cu files only); the other headers are device code."""
    host = re.compile(r"<<<|cudaLaunch|cudaOccupancy|cudaFuncSetAttribute|cudaMemsetAsync|cudaGetDevice")
    for path in _device_headers():
        if path.name != "launch.cuh":
            assert not host.search(path.read_text()), f"{path.parent.name}/{path.name}"
