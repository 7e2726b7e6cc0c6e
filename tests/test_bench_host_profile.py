"""harness.bench host-profile at tiny sizes on the CPU: where a call's host time goes, the GPU-only
figures' arithmetic, the layouts and traces (the numbers mean nothing there)."""

from __future__ import annotations

import json

import pytest
import torch


def test_host_profile_attributes_each_calls_host_time(tmp_path):
    """host-profile: per call, the ops the composed attention issues (two bmm forward), the autograd
    engine's nodes in the backward, the project's Python in the stack pass, and nothing of the profiler's
    own or from outside the profiled calls."""
    from harness.bench.host_profile import run_host_profile

    rows = run_host_profile(["torch"], "attention", [(1, 2, 16, 8)], tmp_path, calls=3, top=100)
    assert [r.direction for r in rows] == ["fwd", "fwd+bwd"]
    for r in rows:
        assert not r.error and r.issue_us > 0 and r.idle_issue_us > 0 and r.profiled_us > 0 and r.calling_thread_us > 0
        assert r.events and all(e["kind"] != "python" for e in r.events)
        assert any("kernels/compose.py" in e["name"] for e in r.python)
        assert not any("torch/profiler" in e["name"] or " at 0x" in e["name"] for e in r.events + r.python)
        # the threads' totals are the events' (all listed at top=100); on a CPU the backward runs on the caller
        assert sum(e["self_us"] for e in r.events) == pytest.approx(r.calling_thread_us + r.other_threads_us)
        assert r.other_threads_us == 0 and r.runtime_us == 0
    assert {e["name"]: e for e in rows[0].events}["aten::bmm"]["count"] == 2
    assert any(e["name"].startswith("autograd::engine::evaluate_function") for e in rows[1].events)
    assert "| torch | attention | 1x2x16x8 | dense | fwd+bwd |" in (tmp_path / "host_profile.md").read_text()
    with pytest.raises(ValueError, match="host-profile takes the ops attention, softmax"):
        run_host_profile(["torch"], "cross_entropy", [(1, 2, 16, 8)], tmp_path)


def test_host_profile_in_the_models_layout_with_a_trace(tmp_path):
    """--layout bthd hands the attention (B, T, H, d) memory viewed as (B, H, T, d) (the backward's
    gradients then match those views); --trace writes each row's ops pass as a Chrome trace; the GPU-only
    figures stay None on a CPU; a layout for the softmax is refused."""
    from harness.bench import host_profile

    for layout, strides in (("bthd", (256, 8, 16, 1)), ("dense", (256, 128, 8, 1))):  # (T H d, d, H d, 1) for the views
        q, k, v, do = host_profile.attention_inputs((1, 2, 16, 8), "cpu", torch.float32, layout)
        assert [(tuple(t.shape), t.stride(), t.is_leaf, t.requires_grad) for t in (q, k, v)] == [
            ((1, 2, 16, 8), strides, True, True)] * 3
        assert do.shape == q.shape and not do.requires_grad
    rows = host_profile.run_host_profile(["torch"], "attention", [(1, 2, 16, 8)], tmp_path, calls=2, top=5,
                                         layout="bthd", trace=True)
    assert [(r.layout, r.direction) for r in rows] == [("bthd", "fwd"), ("bthd", "fwd+bwd")]
    assert all(not r.error and r.blocking_us is None and r.gpu_kernel_us is None and r.gpu_idle_us is None
               and r.syncs is None for r in rows)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == ["torch_attention_1x2x16x8_bthd_fwd.json", "torch_attention_1x2x16x8_bthd_fwd_bwd.json"]
    assert "traceEvents" in json.loads((tmp_path / "traces" / traces[1]).read_text())
    assert "| torch | attention | 1x2x16x8 | bthd | fwd+bwd |" in (tmp_path / "host_profile.md").read_text()
    with pytest.raises(ValueError, match="--layout 'bthd' is not accepted for softmax"):
        host_profile.run_host_profile(["torch"], "softmax", [(1, 2, 8, 8)], tmp_path, layout="bthd")
    from harness.bench import main

    with pytest.raises(SystemExit):
        main(["host-profile", "--op", "softmax", "--layout", "bthd", "--out", str(tmp_path)])


def test_host_profile_gpu_time_and_blocking_calls():
    """The device's kernels' time per call counts overlapping kernels once and the idle time is the span's
    rest; only runtime calls that wait for the device count as blocking."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from harness.bench.host_profile import _BLOCKING, WINDOW, gpu_time

    def ev(start, end, device=DeviceType.CUDA, name="kernel"):
        return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end), name=name)

    # kernels 10-20 and 15-30 overlap (busy 10-30), a gap to 50, then 50-60; neither a CPU event nor the
    # window's own range on the device (kineto's gpu_user_annotation) is device time
    got = gpu_time([ev(50, 60), ev(10, 20), ev(15, 30), ev(0, 100, DeviceType.CPU), ev(5, 70, name=WINDOW)], calls=2)
    assert got == {"gpu:kernel": (20 + 10) / 2, "gpu:idle": 20 / 2}
    assert gpu_time([ev(0, 100, DeviceType.CPU)], calls=1) == {}
    for name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                 "cuMemcpyDtoH_v2", "cudaMalloc", "cudaFree", "cuMemAlloc_v2", "cuCtxSynchronize", "cudaHostAlloc"):
        assert _BLOCKING.match(name), name
    for name in ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync", "cudaMallocAsync", "cudaFreeAsync",
                 "cudaStreamIsCapturing", "cudaEventRecord", "cudaMemsetAsync"):
        assert not _BLOCKING.match(name), name


def test_host_profile_tells_python_events_where_torch_does_not_flag_them():
    """torch 2.11's FunctionEvent has no is_python_function (run AA): the Python tracer's events are then told
    by their names."""
    from types import SimpleNamespace

    from harness.bench.host_profile import _kind

    assert _kind(SimpleNamespace(name="kernels/compose.py(19): attention")) == "python"
    assert _kind(SimpleNamespace(name="<built-in method run_backward of torch._C._EngineBase object>")) == "python"
    assert _kind(SimpleNamespace(name="aten::bmm")) == "op"
    assert _kind(SimpleNamespace(name="cudaLaunchKernel")) == "runtime"
    assert _kind(SimpleNamespace(name="aten::bmm", is_python_function=True)) == "python"


def test_host_profile_cli_profiles_the_softmax(tmp_path):
    from harness.bench import main

    main(["host-profile", "--op", "softmax", "--methods", "torch", "--shapes", "1,2,8,8", "--calls", "2",
          "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "host_profile.json").read_text())["rows"]
    assert [(r["method"], r["direction"]) for r in saved] == [("torch", "fwd"), ("torch", "fwd+bwd")]
    assert any(e["name"] == "aten::_softmax" for e in saved[0]["events"])
    with pytest.raises(SystemExit):
        main(["host-profile", "--shapes", "1,2,8", "--out", str(tmp_path)])


@pytest.mark.gpu
def test_host_profile_names_the_line_of_each_synchronization():
    """torch_syncs: a call that reads a device value back is reported with this file's line; one that only
    issues kernels reports none; the sync-debug mode is left as it was."""
    from harness.bench.host_profile import torch_syncs

    x = torch.randn(1024, device="cuda")
    assert torch_syncs(lambda: x.exp().sum()) == []
    found = torch_syncs(lambda: x.sum().item())
    assert len(found) == 1 and "test_bench_host_profile.py:" in found[0], found
    assert torch.cuda.get_sync_debug_mode() == 0


def test_host_profile_table_counts_and_lists_the_synchronizations():
    """A row's torch-reported synchronizations: counted in the summary table (- where none could be asked,
    on a CPU) and listed with their lines under the row's events."""
    from harness.bench.host_profile import ProfileRow, _table

    event = {"name": "aten::bmm", "kind": "op", "thread": "calling", "count": 1.0, "self_us": 3.0}
    rows = [ProfileRow("flash", "attention", (1, 2, 16, 8), "fwd+bwd", 3, events=[event],
                       syncs=["called a synchronizing CUDA operation (kernels/x.py:12)"]),
            ProfileRow("torch", "attention", (1, 2, 16, 8), "fwd", 3, events=[event])]
    text = _table(rows)
    header, rule, flash, torch_row = text.splitlines()[:4]
    assert header.count("|") == rule.count("|") == flash.count("|") == torch_row.count("|")
    cells = [c.strip() for c in header.split("|")]
    assert flash.split("|")[cells.index("torch syncs")].strip() == "1"
    assert torch_row.split("|")[cells.index("torch syncs")].strip() == "-"
    assert "Synchronizations torch reports in one call: called a synchronizing CUDA operation (kernels/x.py:12)" in text
    assert text.count("Synchronizations torch reports") == 1
