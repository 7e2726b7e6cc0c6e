"""What every benchmark table shares: dtypes by name, the two timings of one callable (eager as a
training loop calls it, and CUDA-graph replay: the kernels alone), CSV and number formatting, and the
parsing of the command-line lists the tables take (sizes, method names, shapes), and the attention's
inputs in either layout."""

from __future__ import annotations

import csv
import gc
import io
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Union

import torch

import kernels
from harness.bench.timing import bench_graph_ms, bench_ms
from harness.results import atomic_write_text

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_ints(s: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3] (empty items skipped)."""
    return [int(v) for v in s.split(",") if v.strip()]


def parse_names(s: str) -> Optional[list[str]]:
    """'a, b' -> ['a', 'b']; None for none (the table's default methods)."""
    out = [m.strip() for m in s.split(",") if m.strip()]
    return out or None


def parse_shapes(error: Callable[[str], None], flag: str, s: str, arity: Union[int, tuple[int, ...]]) -> list[tuple]:
    """'1,2,3;4,5,6' -> [(1, 2, 3), (4, 5, 6)]; ``error`` (the parser's) where one has not ``arity`` numbers
    (one of them, for a tuple of arities) or one is not an integer."""
    arities = (arity,) if isinstance(arity, int) else tuple(arity)
    try:
        out = [tuple(parse_ints(c)) for c in s.split(";") if c.strip()]
    except ValueError:
        out = [()]
    if not out or any(len(c) not in arities for c in out):
        count = " or ".join(map(str, arities))
        error(f"{flag} takes shapes of {count} integers separated by ';' (got {s!r})")
    return out


def runnable(methods: Optional[list[str]], op: str) -> Optional[list[str]]:
    """The asked-for methods that can run here; the others are named with the reason and skipped."""
    if methods is None:
        return None
    avail = kernels.available_methods(include_timing_only=True)
    keep = []
    for m in methods:
        a = avail.get(m)
        if a is None:
            print(f"skipping {m}: unknown method (registered: {', '.join(sorted(avail))})")
        elif not a.available:
            print(f"skipping {m}: {a.reason}")
        elif op not in a.ops:
            print(f"skipping {m}: it does not provide {op} (it provides {', '.join(a.ops)})")
        else:
            keep.append(m)
    return keep


def qkv_inputs(B: int, H: int, tq: int, tk: int, d: int, dtype: torch.dtype, layout: str, device: str,
               kv: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, Tq, d), k and v (B, kv or H, Tk, d), seeded (the same values on any device); ``layout``
    "bthd": the model's (B, T, H, d) memory viewed as (B, H, T, d) (strided, not copied), else dense."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def one(t: int, h: int) -> torch.Tensor:
        x = torch.randn((B, t, h, d) if layout == "bthd" else (B, h, t, d), generator=g).to(device, dtype)
        return x.transpose(1, 2) if layout == "bthd" else x

    return one(tq, H), one(tk, kv or H), one(tk, kv or H)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


#: keys (e.g. a method's name) whose capture failed once: not tried again in this process, since a
#: failed capture can keep the memory it allocated (a table over several sizes would run out of it)
_UNCAPTURABLE: set = set()


def eager_and_graph_ms(fn: Callable[[], object], rep_ms: int, key: Optional[str] = None) -> tuple[float, Optional[float]]:
    """(eager ms, graph-replay ms): ``triton.testing.do_bench`` medians (CUDA events, L2 flushed between
    repetitions), first calling ``fn`` as a training loop does (host launch cost included), then
    replaying one CUDA-graph capture of it (kernel time alone; None where capture is not possible,
    and from then on for the same ``key``)."""
    eager = bench_ms(fn, rep_ms)
    if not torch.cuda.is_available() or (key is not None and key in _UNCAPTURABLE):
        return eager, None
    graph, captured = bench_graph_ms(fn, rep_ms)
    if not captured and key is not None:
        _UNCAPTURABLE.add(key)
    return eager, graph if captured else None


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_us(fn: Callable[[], object], calls: int = 200, repeats: int = 7, warmup: int = 20) -> tuple[float, float]:
    """(median, p90/p50) of the host microseconds per call of ``fn`` over ``repeats`` runs of ``calls``:
    the wall time of the calls in a row, the device synchronized only before and after each run. Kept
    short enough that the launch queue never fills, it is the host's cost of issuing a call whatever the
    kernels take; where it nears the eager time of a call, the GPU waited on the host."""
    for _ in range(warmup):
        fn()
    _sync()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e6 / calls)
        _sync()
    per_call.sort()
    p50 = statistics.median(per_call)
    p90 = per_call[min(len(per_call) - 1, int(round(0.9 * (len(per_call) - 1))))]
    return p50, p90 / p50


def issue_us(fn: Callable[[], object]) -> Optional[float]:
    """The host microseconds to issue one call of a benchmark-sized ``fn`` (``host_us`` over a few short
    runs: ten calls in flight at most); None without a GPU (nothing runs asynchronously there: it would
    time the work itself again)."""
    if not torch.cuda.is_available():
        return None
    return host_us(fn, calls=10, repeats=5, warmup=2)[0]


def free_memory() -> None:
    """What nothing references any more collected (reference cycles too: an exception's traceback and the frames
    it holds), and the allocator's cached blocks handed back to the device once its work is done."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def peak_extra_gib(fn: Callable[[], object]) -> Optional[float]:
    """GiB allocated at the peak of ``fn()`` above what was allocated before it (None without a GPU)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    free_memory()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def fmt(v, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def write_rows_csv(rows: list, path: Path) -> None:
    if not rows:
        return
    dicts = [asdict(r) if hasattr(r, "__dataclass_fields__") else dict(r) for r in rows]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dicts[0]))
    w.writeheader()
    w.writerows(dicts)
    atomic_write_text(path, buf.getvalue())


def error_text(exc: BaseException) -> str:
    """The error's type and first line (200 characters); for CUDA's out-of-memory error also its account
    of what PyTorch allocated and reserved (past those 200), which says whose memory filled the GPU."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {first[:200]}"
    held = re.search(r"Of the allocated memory .*? reserved by PyTorch but unallocated", first)
    return text + (f" [{held.group(0)}]" if held and held.group(0) not in text else "")
