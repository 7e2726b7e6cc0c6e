"""``python -m harness.bench kernels``: the softmax table.

Every method that implements the softmax (by default every one that can run here), forward and
backward separately, against the device-to-device copy bandwidth measured in the same run. GB/s
counts 2 x tensor bytes forward (read x, write y) and 3 x backward (read y and dy, write dx), whatever
a method really moves, so a method that moves more bytes shows as a lower effective bandwidth. Two
timings side by side: **eager**, as a training loop calls the method (``triton.testing.do_bench``:
CUDA events, L2 flushed between repetitions, medians; host launch cost included), and **graph**, one
CUDA-graph capture replayed (the kernels alone); beside them, the host's time to issue one call
(``common.issue_us``: where it nears the eager time, the GPU waited on the host). Targets are read off
the eager column. Backward =
(forward + backward) - forward, each timed the same way, through ``torch.autograd.grad``. Each
method's forward is checked against float64 on the benchmark input first; a wrong result is marked
and gets no ratio. The attention-shaped case (causal scores B x H x T x T, scale 1/8) is timed too,
with the measured memory floor of a fused causal forward. Writes markdown, CSV, JSON and a chart.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import kernels
from harness.bench.common import (DTYPES, dtype_name, eager_and_graph_ms, error_text, fmt, free_memory, issue_us,
                                  parse_ints, parse_names, runnable, write_rows_csv)
from harness.bench.timing import copy_bandwidth, error_on_device, write_bandwidth
from harness.bench.tuning.traffic import causal_traffic_ms
from harness.env import environment, switches_text
from harness.results import atomic_write_text, write_json

DEFAULT_SIZES = "128,256,512,1024,2048,4096,8192,16384,32768,65536,262144"
DEFAULT_BASELINES = ("torch", "compile")


@dataclass
class KernelRow:
    method: str
    dtype: str
    n: int
    rows: int
    causal: bool
    fwd_ms: Optional[float] = None  # eager
    bwd_ms: Optional[float] = None
    fwd_graph_ms: Optional[float] = None  # CUDA-graph replay
    bwd_graph_ms: Optional[float] = None
    fwd_host_us: Optional[float] = None  # host time to issue one call (common.issue_us)
    fwd_bwd_host_us: Optional[float] = None
    fwd_gbs: Optional[float] = None
    bwd_gbs: Optional[float] = None
    fwd_graph_gbs: Optional[float] = None
    bwd_graph_gbs: Optional[float] = None
    fwd_frac_copy: Optional[float] = None
    bwd_frac_copy: Optional[float] = None
    fwd_graph_frac_copy: Optional[float] = None
    bwd_graph_frac_copy: Optional[float] = None
    fwd_vs_best_baseline: Optional[float] = None  # eager GB/s over the faster correct baseline's
    bwd_vs_best_baseline: Optional[float] = None
    correct: Optional[bool] = None
    error: str = ""


def default_methods() -> list[str]:
    """Every method that implements the softmax itself and can run here (timing-only ones excluded)."""
    return [n for n, a in kernels.available_methods(op="softmax").items() if a.available and a.ops["softmax"] == "native"]


def _check_forward(y: torch.Tensor, x: torch.Tensor, scale: float, causal: bool, dtype: torch.dtype) -> bool:
    ref = kernels.reference_softmax(x, scale=scale, causal=causal)  # float64 on the device
    return error_on_device(y, ref) <= kernels.FWD_TOL[dtype]


def measure_method(method: str, shape: tuple, dtype: torch.dtype, scale: float, causal: bool, device: str,
                   rep_ms: int) -> KernelRow:
    n = shape[-1]
    rows = int(torch.Size(shape).numel() // n)
    row = KernelRow(method, dtype_name(dtype), n, rows, causal)
    try:
        fn = kernels.bind(method)
        m = kernels.get_method(method)
        if m.prepare is not None:
            m.prepare()
        x = torch.randn(shape, device=device, dtype=torch.float32).mul_(2).to(dtype).requires_grad_(True)
        y = fn(x, scale, causal)  # also compiles / JITs: outside the timed region
        row.correct = _check_forward(y.detach(), x.detach(), scale, causal, dtype)
        dy = torch.randn_like(y)
        torch.autograd.grad(y, x, dy)  # warm the backward (compile) too
        del y

        def forward():
            with torch.no_grad():
                return fn(x, scale, causal)

        def forward_backward():
            return torch.autograd.grad(fn(x, scale, causal), x, dy)

        row.fwd_ms, row.fwd_graph_ms = eager_and_graph_ms(forward, rep_ms)
        fb_ms, fb_graph_ms = eager_and_graph_ms(forward_backward, rep_ms)
        row.bwd_ms = max(fb_ms - row.fwd_ms, 1e-6)
        row.fwd_host_us, row.fwd_bwd_host_us = issue_us(forward), issue_us(forward_backward)
        if fb_graph_ms is not None and row.fwd_graph_ms is not None:
            row.bwd_graph_ms = max(fb_graph_ms - row.fwd_graph_ms, 1e-6)
        nbytes = x.numel() * x.element_size()
        gbs = lambda moved, ms: None if ms is None else moved / (ms * 1e-3) / 1e9  # noqa: E731
        row.fwd_gbs, row.fwd_graph_gbs = gbs(2 * nbytes, row.fwd_ms), gbs(2 * nbytes, row.fwd_graph_ms)
        row.bwd_gbs, row.bwd_graph_gbs = gbs(3 * nbytes, row.bwd_ms), gbs(3 * nbytes, row.bwd_graph_ms)
        del x, dy
    except Exception as exc:  # one failing method must not stop the table
        row.error = error_text(exc)
    finally:
        free_memory()
    return row


def fill_ratios(rows: list[KernelRow], copy_gbs: float, baselines: tuple = DEFAULT_BASELINES) -> None:
    for r in rows:
        for d in ("fwd", "bwd"):
            for kind in ("", "_graph"):
                v = getattr(r, f"{d}{kind}_gbs")
                if v:
                    setattr(r, f"{d}{kind}_frac_copy", v / copy_gbs)
        if not r.correct:
            continue  # no speedup reported for a wrong result
        peers = [p for p in rows if p.method in baselines and p.correct
                 and (p.dtype, p.n, p.causal, p.rows) == (r.dtype, r.n, r.causal, r.rows)]
        for d in ("fwd", "bwd"):
            best = max((getattr(p, f"{d}_gbs") for p in peers if getattr(p, f"{d}_gbs")), default=None)
            mine = getattr(r, f"{d}_gbs")
            if best and mine:
                setattr(r, f"{d}_vs_best_baseline", mine / best)


def markdown_table(rows: list[KernelRow], copy_gbs: float, header: str, baselines: tuple = DEFAULT_BASELINES) -> str:
    peers = ", ".join(baselines)
    lines = [
        header, "",
        f"Copy ceiling (device-to-device, read + write): **{copy_gbs:.0f} GB/s**. Eager: as a training loop calls "
        "the method (launch cost included); graph: one CUDA-graph capture replayed (the kernels alone). Backward = "
        f"(forward + backward) - forward. Ratios to the faster correct of {peers}, eager. Host us: the host's time to "
        "issue one forward / forward + backward; where it nears the eager time (fwd ms, or fwd + bwd ms), the GPU "
        "waited on the host.", "",
        f"| method | dtype | N | rows | causal | fwd GB/s eager | fwd / copy | fwd GB/s graph | fwd vs best({peers}) "
        f"| bwd GB/s eager | bwd / copy | bwd GB/s graph | bwd vs best({peers}) | fwd / fwd+bwd ms eager "
        "| host us fwd / fwd+bwd | correct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r.correct else ("**NO**" if r.correct is False else f"error: {r.error}")
        lines.append(
            f"| {r.method} | {r.dtype} | {r.n} | {r.rows} | {'yes' if r.causal else 'no'} | {fmt(r.fwd_gbs)} "
            f"| {fmt(r.fwd_frac_copy, '.2f')} | {fmt(r.fwd_graph_gbs)} | {fmt(r.fwd_vs_best_baseline, '.2f')} "
            f"| {fmt(r.bwd_gbs)} | {fmt(r.bwd_frac_copy, '.2f')} | {fmt(r.bwd_graph_gbs)} "
            f"| {fmt(r.bwd_vs_best_baseline, '.2f')} | {fmt(r.fwd_ms, '.3f')} / {fmt(_sum(r.fwd_ms, r.bwd_ms), '.3f')} "
            f"| {fmt(r.fwd_host_us)} / {fmt(r.fwd_bwd_host_us)} | {ok} |"
        )
    return "\n".join(lines) + "\n"


def _sum(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a + b


def plot(rows: list[KernelRow], copy_gbs: float, path: Path, dtype: str) -> None:
    # matplotlib loads only when a chart is drawn (heavy, and not needed for the tables)
    import matplotlib

    matplotlib.use("Agg")
    # after use("Agg"): pyplot picks its backend when it is first imported
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, d, title in ((axes[0], "fwd", "forward"), (axes[1], "bwd", "backward")):
        for i, method in enumerate(dict.fromkeys(r.method for r in rows)):
            mine = sorted((r for r in rows if r.method == method and r.dtype == dtype and not r.causal), key=lambda r: r.n)
            for kind, style in (("", "-"), ("_graph", ":")):
                pts = [(r.n, getattr(r, f"{d}{kind}_gbs")) for r in mine if getattr(r, f"{d}{kind}_gbs")]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o" if not kind else None,
                            color=colors[i % len(colors)], label=f"{method} ({'eager' if not kind else 'graph'})")
        ax.axhline(copy_gbs, color="black", linestyle="--", label=f"copy {copy_gbs:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row length N")
        ax.set_title(f"softmax {title}, {dtype} (solid: eager, dotted: graph replay)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("effective GB/s")
    axes[1].legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class KernelBench:
    copy_gbs: float
    write_gbs: float = 0.0
    rows: list[KernelRow] = field(default_factory=list)
    attention: list[dict] = field(default_factory=list)
    causal_floor_ms: Optional[float] = None


def run_kernel_bench(methods: Optional[list[str]], sizes: list[int], elements: int, dtype: str, fp32_sizes: list[int],
                     attention_shape: Optional[tuple], out: Path, rep_ms: int = 100,
                     baselines: tuple = DEFAULT_BASELINES) -> KernelBench:
    methods = methods or default_methods()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment()
    copy_gbs = copy_bandwidth(device, nbytes=min(2**30, 4 * elements * 2) if device == "cuda" else 2**22)
    res = KernelBench(copy_gbs, write_bandwidth(device, nbytes=2**30 if device == "cuda" else 2**22))
    plan = [(DTYPES[dtype], n) for n in sizes] + [(torch.float32, n) for n in fp32_sizes]
    for dt, n in plan:
        shape = (max(1, elements // n), n)
        for m in methods:
            row = measure_method(m, shape, dt, 1.0, False, device, rep_ms)
            res.rows.append(row)
            print(f"  {m:8s} {row.dtype:9s} N={n:<7d} fwd {fmt(row.fwd_gbs):>6s} (graph {fmt(row.fwd_graph_gbs):>6s}) GB/s"
                  f"  bwd {fmt(row.bwd_gbs):>6s} (graph {fmt(row.bwd_graph_gbs):>6s}) GB/s"
                  f"  host {fmt(row.fwd_host_us)}/{fmt(row.fwd_bwd_host_us)} us"
                  f"  {'ok' if row.correct else row.error or 'WRONG'}", flush=True)
    if attention_shape:
        att_rows = []
        for m in methods:
            row = measure_method(m, attention_shape, DTYPES[dtype], 0.125, True, device, rep_ms)
            att_rows.append(row)
            print(f"  {m:8s} causal {attention_shape}: fwd {fmt(row.fwd_ms, '.4f')} ms (graph "
                  f"{fmt(row.fwd_graph_ms, '.4f')}) bwd {fmt(row.bwd_ms, '.4f')} ms", flush=True)
        res.causal_floor_ms = causal_traffic_ms(attention_shape, DTYPES[dtype], device, rep_ms)
        comp = next((r for r in att_rows if r.method == "compile" and r.correct), None)
        for r in att_rows:
            res.attention.append({
                **asdict(r),
                "fwd_vs_compile_time": (r.fwd_ms / comp.fwd_ms) if comp and r.fwd_ms and r.correct else None,
                "bwd_vs_compile_time": (r.bwd_ms / comp.bwd_ms) if comp and r.bwd_ms and r.correct else None,
            })
    fill_ratios(res.rows, copy_gbs, baselines)
    out.mkdir(parents=True, exist_ok=True)
    header = (f"## Softmax kernels on {env['device_name']} (torch {env['torch']}, triton {env['triton']}, "
              f"CUDA {env['cuda']}{switches_text(env)}), rows x N = {elements} elements")
    md = markdown_table(res.rows, copy_gbs, header, baselines)
    md += f"\nWrite-only ceiling (fill): {res.write_gbs:.0f} GB/s.\n"
    if res.attention:
        md += (f"\n### Attention-shaped causal scores {tuple(attention_shape)}, {dtype}, scale 1/8\n\n"
               "| method | fwd ms eager | fwd ms graph | fwd time / compile | bwd ms eager | bwd ms graph "
               "| bwd time / compile | host us fwd / fwd+bwd | correct |\n|---|---|---|---|---|---|---|---|---|\n")
        for a in res.attention:
            md += (f"| {a['method']} | {fmt(a['fwd_ms'], '.4f')} | {fmt(a['fwd_graph_ms'], '.4f')} "
                   f"| {fmt(a['fwd_vs_compile_time'], '.2f')} | {fmt(a['bwd_ms'], '.4f')} | {fmt(a['bwd_graph_ms'], '.4f')} "
                   f"| {fmt(a['bwd_vs_compile_time'], '.2f')} | {fmt(a['fwd_host_us'])} / {fmt(a['fwd_bwd_host_us'])} "
                   f"| {'yes' if a['correct'] else 'NO ' + a['error']} |\n")
        comp_ms = next((a["fwd_ms"] for a in res.attention if a["method"] == "compile" and a["correct"]), None)
        if res.causal_floor_ms:
            md += (f"| memory floor (forward bytes, no math; graph) | | {res.causal_floor_ms:.4f} | "
                   f"{fmt(res.causal_floor_ms / comp_ms if comp_ms else None, '.2f')} | | | | | |\n")
    atomic_write_text(out / "kernels.md", md)
    write_rows_csv(res.rows, out / "kernels.csv")
    write_json(out / "kernels.json", {"env": env, "copy_gbs": copy_gbs, "write_gbs": res.write_gbs,
                                      "rows": [asdict(r) for r in res.rows], "attention": res.attention,
                                      "causal_floor_ms": res.causal_floor_ms, "baselines": list(baselines)})
    plot(res.rows, copy_gbs, out / "kernels.png", dtype_name(DTYPES[dtype]))
    print(md)
    return res


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="", help="comma-separated methods (default: every softmax method here)")
    p.add_argument("--baselines", default=",".join(DEFAULT_BASELINES), help="ratios against these (default: %(default)s)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="row lengths N (default: %(default)s)")
    p.add_argument("--elements", type=int, default=2**27, help="rows x N per measurement (default: 2^27)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--fp32-sizes", default="1024,16384", help="extra fp32 row lengths ('' for none)")
    p.add_argument("--attention", default="8,12,1024,1024", help="B,H,T,T of the causal case ('' to skip)")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> KernelBench:
    att = tuple(parse_ints(a.attention)) if a.attention else None
    return run_kernel_bench(runnable(parse_names(a.methods), "softmax"), parse_ints(a.sizes), a.elements, a.dtype,
                            parse_ints(a.fp32_sizes), att, a.out, a.rep_ms, tuple(parse_names(a.baselines) or ()))
