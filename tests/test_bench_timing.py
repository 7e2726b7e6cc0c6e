"""The benchmarks' timing and memory helpers (harness/bench/timing.py, common.py): graph capture and when it is
not tried, host time per call, warm-up, and each row's memory handed back before the next."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch


def test_a_failed_capture_is_not_tried_again_for_the_same_key(monkeypatch):
    from harness.bench import common

    tried = []
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "bench_ms", lambda fn, rep_ms: 1.5)
    monkeypatch.setattr(common, "bench_graph_ms", lambda fn, rep_ms: tried.append(fn) or (2.0, False))
    monkeypatch.setattr(common, "_UNCAPTURABLE", set())
    assert common.eager_and_graph_ms(lambda: None, 5, "liger") == (1.5, None)
    assert common.eager_and_graph_ms(lambda: None, 5, "liger") == (1.5, None)
    assert len(tried) == 1  # the second call did not capture again
    monkeypatch.setattr(common, "bench_graph_ms", lambda fn, rep_ms: (0.5, True))
    assert common.eager_and_graph_ms(lambda: None, 5, "cuda") == (1.5, 0.5)
    assert common.eager_and_graph_ms(lambda: None, 5) == (1.5, 0.5)  # no key: always tried


def test_a_function_that_makes_the_host_wait_is_never_captured(monkeypatch):
    """Liger's cross-entropy (.item()) and Cut Cross-Entropy (nonzero) make the host wait: no capture can hold that,
    and a capture that failed left PyTorch's allocator in capture mode, empty_cache() returning nothing after it (on
    an H100 the loss table's later rows ran out of memory). Such a function is timed eagerly, never captured; one
    whose capture fails otherwise leaves the stream as it found it."""
    from harness.bench import timing

    class Stream:
        def wait_stream(self, other):
            pass

    default, capturing = Stream(), Stream()
    state = {"mode": 0, "stream": default}
    graphs = []

    class Graph:  # torch.cuda.graph where the capture fails: its __exit__ raises before it restores the stream
        def __init__(self, graph):
            pass

        def __enter__(self):
            state["stream"] = capturing

        def __exit__(self, *exc):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    cuda = timing.torch.cuda
    for name, fake in {"is_available": lambda: True, "get_sync_debug_mode": lambda: state["mode"],
                       "set_sync_debug_mode": lambda mode: state.update(mode=mode), "Stream": Stream,
                       "stream": lambda s: contextlib.nullcontext(), "current_stream": lambda: state["stream"],
                       "set_stream": lambda s: state.update(stream=s), "CUDAGraph": lambda: graphs.append(1),
                       "graph": Graph, "synchronize": lambda: None, "empty_cache": lambda: None}.items():
        monkeypatch.setattr(cuda, name, fake)
    monkeypatch.setattr(timing, "bench_ms", lambda fn, rep_ms: 1.5)

    def waits():
        if state["mode"] == "error":  # (what PyTorch's sync debug mode does on a synchronizing operation)
            raise RuntimeError("called a synchronizing CUDA operation")

    assert timing.bench_graph_ms(waits, 5) == (1.5, False)
    assert graphs == [] and state["mode"] == 0  # no capture tried; the debug mode as it was
    with pytest.raises(RuntimeError, match="out of memory"):  # any other error is fn's own: it propagates
        timing.bench_graph_ms(lambda: (_ for _ in ()).throw(RuntimeError("CUDA out of memory")), 5)
    assert state["mode"] == 0
    assert timing.bench_graph_ms(lambda: None, 5) == (1.5, False)
    assert graphs == [1] and state["stream"] is default  # tried, failed, and back on the stream it began on


def test_each_bench_row_is_released_once_nothing_of_it_is_referenced(tmp_path, monkeypatch):
    """The loss and attention tables hand a row's memory back (free_memory) only once the row's frame is gone:
    called from within it, the inputs, the closures that time them and a caught exception's traceback were still
    referenced, and in one process the device filled up row after row."""
    import weakref

    from harness.bench import attention, loss

    refs, released = [], []

    def release():
        gc.collect()
        released.append(bool(refs) and all(r() is None for r in refs))

    def fails(fn, rep_ms, key=None):  # the timing ran out of memory: the row gets the error
        refs.append(weakref.ref(fn))
        refs.extend(weakref.ref(c.cell_contents) for c in fn.__closure__ if isinstance(c.cell_contents, torch.Tensor))
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(loss, "free_memory", release)
    monkeypatch.setattr(loss, "eager_and_graph_ms", fails)
    rows = loss._vocab_rows(["torch"], 16, 33, "", "cpu", 5) + loss._linear_rows(["torch"], 8, 12, 33, "", "cpu", 5)
    assert len(rows) == 3 and all("out of memory" in r.error for r in rows), rows
    assert released == [True] * 3  # (torch, torch under autocast, the linear row)

    refs.clear(), released.clear()
    inputs = attention._inputs

    def kept(*args):
        call, tensors, heads = inputs(*args)
        refs.extend(weakref.ref(x) for x in (call, *tensors))
        return call, tensors, heads

    monkeypatch.setattr(attention, "free_memory", release)
    monkeypatch.setattr(attention, "_inputs", kept)
    rows = attention.run_attention_bench(["torch", "sdpa"], [(1, 2, 16, 8)], tmp_path, rep_ms=5)
    assert all(r.correct for r in rows), rows
    assert released == [True, True]


def test_host_us_times_runs_of_calls_and_syncs_only_between_runs(monkeypatch):
    from harness.bench import common

    events = []
    monkeypatch.setattr(common, "_sync", lambda: events.append("sync"))
    clock = iter(range(0, 10**6, 5))  # every perf_counter read 5 s after the last
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    p50, spread = common.host_us(lambda: events.append("call"), calls=4, repeats=3, warmup=2)
    # warm-up, then per run: its calls back to back, one sync after them (none between the calls)
    assert events == ["call"] * 2 + ["sync"] + (["call"] * 4 + ["sync"]) * 3
    assert p50 == 5 * 1e6 / 4 and spread == 1.0  # (one 5 s interval per run of 4 calls)


def test_issue_time_is_a_gpu_figure_only(monkeypatch):
    from harness.bench import common

    calls = []
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: False)
    assert common.issue_us(lambda: calls.append(1)) is None and not calls  # (on a CPU it would time the work again)
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "_sync", lambda: None)
    assert common.issue_us(lambda: calls.append(1)) > 0 and len(calls) == 2 + 5 * 10


def test_warm_then_repeat_calls_once_then_repeat_times():
    from harness.bench.timing import warm_then_repeat

    calls = []
    warm_then_repeat(lambda: calls.append(1), 3)
    assert len(calls) == 4
