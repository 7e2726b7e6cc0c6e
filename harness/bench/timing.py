"""Timing utilities shared by the benchmark tables and the tuning tools (``harness/bench/tuning/``):
medians of CUDA-event timings, CUDA-graph replays, the copy and write ceilings, and the float64 checks a
timed kernel must pass first. Wall clock on a CPU, where the numbers mean nothing.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch

from kernels.reference import reference_softmax, reference_softmax_backward


def bench_ms(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median time of fn in ms: CUDA events via triton.testing.do_bench on a GPU, wall clock on a CPU."""
    if torch.cuda.is_available():
        import triton.testing  # (lazy: only a GPU times by CUDA events, and Triton must see TRITON_INTERPRET first)

        return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def warm_then_repeat(fn: Callable[[], object], repeat: int) -> None:
    """For a profiler that picks launches by count (Nsight Compute's --launch-skip): one warm-up call of fn
    (JIT, first-use builds), then ``repeat`` calls, the device synchronized after each part."""
    for calls in (1, repeat):
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def _synchronizes(fn: Callable[[], object]) -> bool:
    """Whether ``fn`` makes the host wait on the device (``.item()``, ``nonzero``, a copy to the host: Liger's
    cross-entropy, Cut Cross-Entropy), which no CUDA graph can capture; fn is called once on the current stream
    with PyTorch's sync debug mode raising on such a wait."""
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        if "synchronizing CUDA operation" not in str(exc):
            raise
        return True
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    return False


def bench_graph_ms(fn: Callable[[], object], rep_ms: int = 100) -> tuple[float, bool]:
    """Median time of fn's GPU work: captured once in a CUDA graph and timed by replaying it, so the
    host-side cost of launching (Python, autograd, dispatch) does not hide inside kernel times.
    Falls back to timing fn directly (second value False) where capture is not possible."""
    if not torch.cuda.is_available():
        return bench_ms(fn, rep_ms), False
    if _synchronizes(fn):
        # Not even tried: a capture that fails (here, on fn's host sync) cannot be cleaned up from Python. PyTorch
        # releases a graph's private pool only after a capture that ended, and where capture_end raises before it
        # tells the caching allocator the capture is over, empty_cache() skips the default pool from then on (as
        # during any capture): on an H100 the loss table's rows kept their memory from liger's row on (15 GiB,
        # 39 after torch, ...) until one ran out.
        return bench_ms(fn, rep_ms), False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    stream = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        failed = False
    except Exception:
        failed = True
    if failed:
        # A capture that failed otherwise: torch.cuda.graph's __exit__ raised before it restored the stream (back
        # to it), and what fn allocated inside went to the graph's private pool: drop the graph and hand back what
        # can be. (Outside the except block: the exception's traceback would keep the graph alive.)
        torch.cuda.set_stream(stream)
        del graph
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return bench_ms(fn, rep_ms), False
    return bench_ms(graph.replay, rep_ms), True


def copy_bandwidth(device: str, nbytes: int = 2**30, rep_ms: int = 200) -> float:
    """Device-to-device copy in GB/s counting bytes read + written (the memory ceiling)."""
    n = nbytes // 2
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), rep_ms)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def write_bandwidth(device: str, nbytes: int = 2**30, rep_ms: int = 200) -> float:
    """Write-only bandwidth (fill) in GB/s: the floor for a kernel that must write its whole output."""
    dst = torch.empty(nbytes // 2, device=device, dtype=torch.bfloat16)
    ms = bench_ms(lambda: dst.fill_(1.0), rep_ms)
    return dst.numel() * dst.element_size() / (ms * 1e-3) / 1e9


def error_on_device(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 on the tensors' device (benchmark tensors are GBs: no host copy)."""
    ref = ref.to(torch.float64)
    return ((out.to(torch.float64) - ref).norm() / ref.norm()).item()


def sweep_references(x: torch.Tensor, causal: bool) -> tuple:
    """For a sweep at scale 1: the float64 forward reference, the output y in x's dtype (the backward's
    input), a random dy, and the float64 backward reference for (y, dy)."""
    ref = reference_softmax(x, causal=causal)
    y = ref.to(x.dtype)
    dy = torch.randn_like(x)
    return ref, y, dy, reference_softmax_backward(y, dy)
