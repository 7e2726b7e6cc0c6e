"""``python -m harness.bench host-profile``: where the host's microseconds go when a call is issued.

The attention table's issue-time column (``common.issue_us``: the host's time to issue one forward +
backward, the device synchronized only around a run of calls) grows with the problem for every method
(docs/perf.md: flash 430 -> 648 -> 801 us from T = 1024 to 16384, cuDNN 285 -> 511), while the same
call at a tiny shape costs 164 us: at full size it holds more than launch work. This attributes it.
For each method and shape, the forward and the forward + backward are called ``calls`` times in a row,
as the issue time calls them, three ways:

* unprofiled: the issue time itself (``common.host_us``: ten calls in a row, so the GPU is busy with the
  earlier calls while the later ones are issued), and the same call issued onto an idle GPU (synchronized
  before each call): where the first exceeds the second, issuing slows down while the GPU works (the
  driver's queue, a blocking allocation or synchronization) rather than in Python;
* under torch.profiler without stacks: every host-side event that starts and ends inside the run (ATen
  and custom ops, autograd nodes and, on a GPU, the CUDA runtime and driver calls: kernel launches,
  allocations, synchronizations), by self time per call and by thread (the calling one, or another:
  on a GPU the autograd engine runs the backward on its own device thread);
* under torch.profiler with Python stacks: the Python functions, by self time per call (the tracer
  slows Python several-fold: compare functions with each other, not with the issue time; a built-in's
  self time holds the C++ work under it, e.g. the autograd engine's ``run_backward``).

On a GPU each row also gives, from the ops pass, the kernels' own time per call and the GPU's idle time
between them (the span of the run's kernels less their time: where it is large the GPU waited on the
host), and the CUDA runtime and driver calls that block the host until the device catches up
(synchronizations, synchronous copies, allocations and frees) by name and self time: a call whose issue
time grows with the problem but that holds no such call is slow in its own host code, one that holds
one waits for the GPU; and the synchronizations torch itself reports in one call
(``torch.cuda.set_sync_debug_mode``), each with the Python line that made it. ``--layout bthd`` gives the
attention q, k and v as (B, T, H, d) memory viewed as (B, H, T, d), the model's layout after its
projection's split, instead of dense (B, H, T, d) tensors (a method may then lay its gradients out
differently); ``--trace DIR`` writes each row's ops pass as a Chrome trace (chrome://tracing, Perfetto)
for the timeline itself.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import kernels
from harness.bench.attention import variants
from harness.bench.common import (error_text, fmt, free_memory, host_us, parse_names, parse_shapes, qkv_inputs,
                                  runnable)
from harness.env import environment
from harness.results import atomic_write_text, write_json

OPS = ("attention", "softmax")
DEFAULT_SHAPES = {"attention": "16,12,1024,64;4,12,4096,64;1,12,16384,64",
                  "softmax": "8,12,1024,1024"}
WINDOW = "harness.bench.host_profile: calls"
#: events of the profiler itself (entering its range, its Python), never the call's
_PROFILER_OWN = re.compile(r"torch/profiler/|torch/autograd/profiler|_record_function_|^Activity Buffer Request|^"
                           + re.escape(WINDOW))  # (CUPTI's buffer requests: a profile's largest "event" once)
_RUNTIME = re.compile(r"^cu(da)?[A-Z]")
#: runtime and driver calls that make the host wait for the device (a synchronization, a synchronous copy, an
#: allocation or free that the caching allocator could not serve from its pool)
_BLOCKING = re.compile(r"^cu(da)?(Ctx|Device|Stream|Event)Synchronize|^cu(da)?Memcpy(?!.*Async)|^cu(da)?Mem(Alloc|Free)"
                       r"|^cuda(Malloc|Free)(?!Async)|^cuda(Host|MallocHost|FreeHost)")
LAYOUTS = ("dense", "bthd")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # <built-in method to of Tensor object at 0x...>: one name for every tensor


@dataclass
class ProfileRow:
    method: str  # with its options in brackets (sdpa[backend=cudnn])
    op: str
    shape: tuple
    direction: str  # fwd | fwd+bwd
    calls: int
    issue_us: Optional[float] = None  # unprofiled host us per call, calls in a row
    idle_issue_us: Optional[float] = None  # unprofiled host us of one call issued onto an idle GPU
    profiled_us: Optional[float] = None  # the profiled run's wall time per call (ops pass)
    calling_thread_us: Optional[float] = None  # self time per call of the events on the calling thread
    other_threads_us: Optional[float] = None  # ... on any other (the autograd engine's device thread)
    runtime_us: Optional[float] = None  # self time per call of the CUDA runtime and driver calls
    blocking_us: Optional[float] = None  # ... of those that wait for the device (_BLOCKING); None on a CPU
    blocking: list = field(default_factory=list)  # those calls: name, count and self us per call
    gpu_kernel_us: Optional[float] = None  # the GPU kernels' time per call (None on a CPU)
    gpu_idle_us: Optional[float] = None  # per call: the span from the run's first kernel to its last, less their time
    syncs: Optional[list] = None  # the synchronizations torch reports in one call, with the line that made each
    layout: str = "dense"  # the attention's inputs: dense (B, H, T, d), or bthd: (B, T, H, d) memory viewed
    events: list = field(default_factory=list)  # top events: name, kind, thread, count and self us per call
    python: list = field(default_factory=list)  # top Python functions: name, thread, count and self us per call
    error: str = ""


_PY_NAME = re.compile(r"^(<built-in |.*\.py\(\d+\): )")  # a Python function's event, where torch does not flag it


def _kind(e) -> str:
    flagged = getattr(e, "is_python_function", None)  # (torch 2.11's FunctionEvent has no such field)
    if flagged or (flagged is None and _PY_NAME.match(e.name)):
        return "python"
    if _RUNTIME.match(e.name):
        return "runtime"
    return "op" if "::" in e.name else "other"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_calls(fn: Callable[[], object], calls: int, with_stack: bool,
                  trace: Optional[Path] = None) -> tuple[float, list[dict], dict]:
    """Profile ``calls`` calls of ``fn`` (after three unprofiled ones, the device synchronized before and
    after the run, not inside it). Returns the run's wall time per call (us), the events that start and
    end inside the run aggregated by (name, thread) with their count and self host time per call, sorted
    by that time (Python functions only with ``with_stack``, every other host event without), and the
    self time per call by kind ("kind:runtime", ...) and thread ("thread:calling", "thread:other"), and on a
    GPU "gpu:kernel" and "gpu:idle" (:func:`gpu_time`). ``trace``: where to write the run as a Chrome trace."""
    for _ in range(3):
        fn()
    _sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts, with_stack=with_stack) as prof:
        with record_function(WINDOW):
            for _ in range(calls):
                fn()
    _sync()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    events = prof.events()
    win = next((e for e in events if e.name == WINDOW), None)
    if win is None:
        raise RuntimeError("torch.profiler recorded no range around the profiled calls (is another profiler running?)")
    lo, hi = win.time_range.start, win.time_range.end
    agg: dict = {}
    totals: dict = gpu_time(events, calls) if torch.cuda.is_available() else {}
    for e in events:
        if e.device_type != DeviceType.CPU or _PROFILER_OWN.search(e.name):
            continue
        if not (lo <= e.time_range.start and e.time_range.end <= hi):
            continue
        kind = _kind(e)
        if (kind == "python") != with_stack:
            continue
        thread = "calling" if e.thread == win.thread else "other"
        name = _ADDRESS.sub("", e.name)
        a = agg.setdefault((name, thread), {"name": name, "kind": kind, "thread": thread, "count": 0, "self_us": 0.0})
        a["count"] += 1
        a["self_us"] += e.self_cpu_time_total
        for key in (f"kind:{kind}", f"thread:{thread}"):
            totals[key] = totals.get(key, 0.0) + e.self_cpu_time_total / calls
    rows = sorted(agg.values(), key=lambda a: -a["self_us"])
    for a in rows:
        a["count"] /= calls
        a["self_us"] /= calls
    return (hi - lo) / calls, rows, totals


def gpu_time(events, calls: int) -> dict:
    """{"gpu:kernel": the device's kernels' time per call, "gpu:idle": per call, the span from the first
    kernel's start to the last one's end less the time kernels ran (overlapping kernels counted once)}
    over the profile's device events: those of the profiled calls alone, the device having been
    synchronized before the run (empty where the profile holds no device event). Kernels, copies and
    memsets count; the profiled window's own range does not."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == DeviceType.CUDA and not _PROFILER_OWN.search(e.name))  # (not the window's
    # own range, which kineto also marks on the device around the kernels it holds: gpu_user_annotation)
    if not spans:
        return {}
    busy, (lo, hi) = 0.0, spans[0]
    first = lo
    for start, end in spans[1:]:
        if start > hi:  # a gap: the device ran nothing between hi and start
            busy += hi - lo
            lo, hi = start, end
        else:
            hi = max(hi, end)
    busy += hi - lo
    return {"gpu:kernel": busy / calls, "gpu:idle": (hi - first - busy) / calls}


def idle_issue_us(fn: Callable[[], object], repeats: int = 20) -> float:
    """Median host microseconds of one call of ``fn`` issued onto an idle device (synchronized before the
    call and not inside the timed part)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    _sync()
    return statistics.median(times)


def torch_syncs(fn: Callable[[], object]) -> Optional[list[str]]:
    """The synchronizing CUDA operations torch reports in one call of ``fn`` (``set_sync_debug_mode("warn")``,
    after a warm-up call): each as its message and the Python line that made it (the autograd engine re-raises
    its device thread's warnings in the calling thread). None on a CPU. Only torch's own operations are seen
    (``.item()``, a pageable copy, ``nonzero``...), not a driver call a kernel launcher makes itself."""
    if not torch.cuda.is_available():
        return None
    fn()
    _sync()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync()
    # (torch's own "Synchronization debug mode is a prototype feature" warning, given on switching the mode
    # on, names no operation)
    return [f"{str(w.message).splitlines()[0]} ({w.filename}:{w.lineno})" for w in seen
            if "called a synchronizing" in str(w.message)]


def attention_inputs(shape: tuple, device: str, dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, ...]:
    """q, k, v (leaves requiring grad) and the output's gradient, each (B, H, T, d): dense, or with
    ``layout`` "bthd" q, k and v as (B, T, H, d) memory viewed as (B, H, T, d) (the model's views)."""
    b, h, t, d = shape
    q, k, v = (x.requires_grad_(True) for x in qkv_inputs(b, h, t, t, d, dtype, layout, device))
    return q, k, v, torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)


def _calls(method: str, options: dict, op: str, shape: tuple, device: str,
           layout: str = "dense") -> dict[str, Callable[[], object]]:
    """direction -> the call: the bound op on benchmark-sized inputs (bf16 on a GPU, fp32 on a CPU),
    causal, as the attention and kernel tables call it; ``layout`` "bthd": the attention's q, k and v
    are (B, T, H, d) memory viewed as (B, H, T, d) (the model's views), each a leaf of its own."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fn = kernels.bind(method, op, **options)
    if op == "attention":
        q, k, v, do = attention_inputs(shape, device, dtype, layout)

        def fwd():
            with torch.no_grad():
                return fn(q, k, v, None, True, 0.0)

        return {"fwd": fwd, "fwd+bwd": lambda: torch.autograd.grad(fn(q, k, v, None, True, 0.0), (q, k, v), do)}
    g = torch.Generator(device=device).manual_seed(0)  # (the attention's inputs: attention_inputs)
    x, dy = (torch.randn(shape, device=device, generator=g).to(dtype) for _ in range(2))
    x.requires_grad_(True)
    scale = shape[-1] ** -0.5

    def fwd_softmax():
        with torch.no_grad():
            return fn(x, scale, True)

    return {"fwd": fwd_softmax, "fwd+bwd": lambda: torch.autograd.grad(fn(x, scale, True), x, dy)}


def _variants(method: str, op: str) -> list[tuple[str, dict]]:
    if op == "attention":
        return variants(method)
    return [(method, {})]


def measure(method: str, options: dict, label: str, op: str, shape: tuple, device: str, calls: int,
            top: int, layout: str = "dense", trace_dir: Optional[Path] = None) -> list[ProfileRow]:
    """The forward and forward + backward rows of one method at one shape (an error is kept in the row);
    ``trace_dir``: each row's ops pass as a Chrome trace there."""
    rows = [ProfileRow(label, op, shape, d, calls, layout=layout) for d in ("fwd", "fwd+bwd")]
    try:
        fns = _calls(method, options, op, shape, device, layout)
        for row in rows:
            fn = fns[row.direction]
            row.issue_us = host_us(fn, calls=calls, repeats=5, warmup=2)[0]
            row.idle_issue_us = idle_issue_us(fn)
            trace = None if trace_dir is None else trace_dir / _trace_name(row)
            row.profiled_us, events, totals = profile_calls(fn, calls, with_stack=False, trace=trace)
            row.calling_thread_us = totals.get("thread:calling", 0.0)
            row.other_threads_us = totals.get("thread:other", 0.0)
            row.runtime_us = totals.get("kind:runtime", 0.0)
            if device == "cuda":
                row.blocking = [e for e in events if e["kind"] == "runtime" and _BLOCKING.match(e["name"])]
                row.blocking_us = sum(e["self_us"] for e in row.blocking)
                row.gpu_kernel_us, row.gpu_idle_us = totals.get("gpu:kernel"), totals.get("gpu:idle")
                row.syncs = torch_syncs(fn)
            row.events = events[:top]
            row.python = profile_calls(fn, calls, with_stack=True)[1][:top]
    except Exception as exc:  # one failing method must not stop the table
        for row in rows:
            row.error = row.error or error_text(exc)
    finally:
        free_memory()
    return rows


def _trace_name(row: ProfileRow) -> str:
    name = f"{row.method}_{row.op}_{'x'.join(map(str, row.shape))}_{row.layout}_{row.direction}.json"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("+", "_"))


def _table(rows: list[ProfileRow]) -> str:
    lines = ["| method | op | shape | layout | direction | issue us | idle issue us | profiled us | calling thread us "
             "| other threads us | runtime calls us | blocking calls us | torch syncs | GPU kernels us | GPU idle us "
             "| largest event |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        syncs = "-" if r.syncs is None else len(r.syncs)
        big = f"{r.events[0]['name'][:60]} ({r.events[0]['self_us']:.1f} us)" if r.events else r.error
        lines.append(f"| {r.method} | {r.op} | {'x'.join(map(str, r.shape))} | {r.layout} | {r.direction} "
                     f"| {fmt(r.issue_us, '.1f')} | {fmt(r.idle_issue_us, '.1f')} | {fmt(r.profiled_us, '.1f')} "
                     f"| {fmt(r.calling_thread_us, '.1f')} | {fmt(r.other_threads_us, '.1f')} | {fmt(r.runtime_us, '.1f')} "
                     f"| {fmt(r.blocking_us, '.1f')} | {syncs} | {fmt(r.gpu_kernel_us, '.1f')} "
                     f"| {fmt(r.gpu_idle_us, '.1f')} | {big} |")
    for r in rows:
        if not r.events:
            continue
        lines += ["", f"### {r.method}, {r.op} {'x'.join(map(str, r.shape))} ({r.layout}), {r.direction}: events by self "
                  "host us per call",
                  "", "| event | kind | thread | per call | self us per call |", "|---|---|---|---|---|"]
        lines += [f"| {e['name'][:90]} | {e['kind']} | {e['thread']} | {e['count']:.2f} | {e['self_us']:.1f} |"
                  for e in r.events + r.python]
        if r.blocking:
            lines += ["", "Blocking runtime calls: " + ", ".join(f"{e['name']} x{e['count']:.2f} ({e['self_us']:.1f} us)"
                                                              for e in r.blocking)]
        if r.syncs:
            lines += ["", "Synchronizations torch reports in one call: " + "; ".join(r.syncs)]
    return "\n".join(lines) + "\n"


def check_op(op: str, layout: str) -> None:
    """A ValueError saying what is accepted for an op this tool does not profile or a layout it has not."""
    if op not in OPS:
        raise ValueError(f"host-profile takes the ops {', '.join(OPS)}; got {op!r}")
    if layout not in LAYOUTS or (layout != "dense" and op != "attention"):
        raise ValueError(f"host-profile --layout {layout!r} is not accepted for {op}: one of {', '.join(LAYOUTS)} "
                         "(bthd: the attention's only)")


def run_host_profile(methods: Optional[list[str]], op: str, shapes: list[tuple], out: Path, calls: int = 10,
                     top: int = 12, layout: str = "dense", trace: bool = False) -> list[ProfileRow]:
    """Profile every method's op at every shape; host_profile.md and .json are rewritten after each
    method, so a run cut short keeps what it measured. ``layout``: the attention's inputs (``LAYOUTS``);
    ``trace``: each row's ops pass as a Chrome trace in ``out``/traces."""
    check_op(op, layout)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out.mkdir(parents=True, exist_ok=True)
    trace_dir = out / "traces" if trace else None
    if trace_dir is not None:
        trace_dir.mkdir(exist_ok=True)
    env = environment()
    names = methods or [n for n, a in kernels.available_methods(op=op).items() if a.available]
    rows: list[ProfileRow] = []
    for shape in shapes:
        for method in names:
            for label, options in _variants(method, op):
                new = measure(method, options, label, op, shape, device, calls, top, layout, trace_dir)
                rows += new
                for r in new:
                    print(f"  {label:24s} {shape} {r.direction:7s} issue {fmt(r.issue_us, '.1f')} us (idle GPU "
                          f"{fmt(r.idle_issue_us, '.1f')}), profiled "
                          f"{fmt(r.profiled_us, '.1f')} (calling thread {fmt(r.calling_thread_us, '.1f')}, others "
                          f"{fmt(r.other_threads_us, '.1f')}, runtime calls {fmt(r.runtime_us, '.1f')}, blocking "
                          f"{fmt(r.blocking_us, '.1f')}, torch syncs {'-' if r.syncs is None else len(r.syncs)}); "
                          f"GPU kernels {fmt(r.gpu_kernel_us, '.1f')}, idle "
                          f"{fmt(r.gpu_idle_us, '.1f')} {r.error}", flush=True)
                write_json(out / "host_profile.json", {"env": env, "device": device, "rows": [asdict(r) for r in rows]})
                atomic_write_text(out / "host_profile.md", _table(rows))
    print(_table(rows).split("\n\n")[0])
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", default="attention", choices=OPS)
    p.add_argument("--methods", default="", help="comma-separated methods (default: every method that provides --op)")
    p.add_argument("--shapes", default="", help="B,H,T,d (attention) or B,H,T,T (softmax) shapes separated by ';' "
                   f"(default: attention {DEFAULT_SHAPES['attention']}; softmax {DEFAULT_SHAPES['softmax']})")
    p.add_argument("--calls", type=int, default=10, help="calls per timed run (default: %(default)s, as the issue time)")
    p.add_argument("--top", type=int, default=12, help="events and Python functions listed per row")
    p.add_argument("--layout", default="dense", choices=LAYOUTS,
                   help="the attention's q, k, v: dense (B, H, T, d), or bthd: (B, T, H, d) memory viewed as (B, H, T, "
                        "d), the model's layout (default: %(default)s)")
    p.add_argument("--trace", action="store_true", help="also write each row's profiled run as a Chrome trace "
                   "(OUT/traces/*.json)")
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[ProfileRow]:
    if a.calls < 1 or a.top < 1:
        error(f"--calls and --top take positive integers (got {a.calls} and {a.top})")
    shapes = parse_shapes(error, "--shapes", a.shapes or DEFAULT_SHAPES[a.op], 4)
    try:
        check_op(a.op, a.layout)
    except ValueError as exc:
        error(str(exc))
    return run_host_profile(runnable(parse_names(a.methods), a.op), a.op, shapes, a.out, a.calls, a.top, a.layout,
                            a.trace)
