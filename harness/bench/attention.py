"""``python -m harness.bench attention``: the attention table.

Causal bf16 attention at the model's shapes (B, H, T, d) for every method that provides attention (by
default every one that can run here): the materialized methods by composition (q k^T -> their
softmax -> v; skipped where the T x T scores would exceed ``MAX_SCORES_GIB``), the fused ones natively
(sdpa's backends, flex, flash). TFLOP/s counts 4 * B * H * T^2 * d / 2 for a causal forward (half the
square) and 3.5x that for forward + backward (the backward's five matmuls against the forward's two,
the causal half likewise), whatever a method really computes. Eager and graph-replay timings and the
host's issue time as in the softmax table; the extra memory is the peak allocated during forward + backward above the
inputs. Each method's output is checked against float64 on one head first; a wrong result is marked.

``layout``: "separate" (q, k, v three tensors, their three gradients: the op alone) or "qkv" (as the model
calls it: one projection output (B, T, 3 H d) and its gradient; a method's native ``attention_qkv`` where it
has one, else its attention on the split views, whose backward concatenates the three gradients, a copy
that the TFLOP/s then include); its files are attention-qkv.md, .csv and .json.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

import kernels
from kernels.contract import split_qkv
from harness.bench.common import (eager_and_graph_ms, error_text, fmt, free_memory, issue_us, parse_names, parse_shapes,
                                  peak_extra_gib, runnable, write_rows_csv)
from harness.env import environment
from harness.results import atomic_write_text, write_json

MAX_SCORES_GIB = 4.0
LAYOUTS = ("separate", "qkv")


@dataclass
class AttentionRow:
    method: str  # the method, with its options in brackets (sdpa[backend=cudnn])
    provided: str  # native | composed; layout qkv: native (qkv) | native, split | composed, split
    b: int
    h: int
    t: int
    d: int
    fwd_ms: Optional[float] = None
    fwd_graph_ms: Optional[float] = None
    fwd_bwd_ms: Optional[float] = None
    fwd_bwd_graph_ms: Optional[float] = None
    fwd_host_us: Optional[float] = None  # host time to issue one call (common.issue_us)
    fwd_bwd_host_us: Optional[float] = None
    fwd_tflops: Optional[float] = None
    fwd_bwd_tflops: Optional[float] = None
    fwd_graph_tflops: Optional[float] = None
    fwd_bwd_graph_tflops: Optional[float] = None
    extra_gib: Optional[float] = None
    correct: Optional[bool] = None
    error: str = ""
    layout: str = "separate"  # separate | qkv (see the module docstring)


def default_methods() -> list[str]:
    return [n for n, a in kernels.available_methods(op="attention").items() if a.available]


def variants(method: str) -> list[tuple[str, dict]]:
    """(label, options) rows of a method: one per value of each option that picks a kernel (sdpa's
    backends, so cuDNN sits beside flash), leaving out the choices that only delegate ('auto') or are
    the unfused reference ('math'); the method alone when it has no options."""
    m = kernels.get_method(method)
    rows = []
    for key, values in m.options.items():
        for v in values:
            if v in ("auto", "math") or kernels.unavailable_reason(method, **{key: v}):
                continue
            rows.append((f"{method}[{key}={v}]", {key: v}))
    return rows or [(method, {})]


def causal_flops(b: int, h: int, t: int, d: int) -> float:
    return 4.0 * b * h * t * t * d / 2


def measure_attention(method: str, shape: tuple, device: str, rep_ms: int, options: Optional[dict] = None,
                      label: Optional[str] = None, layout: str = "separate") -> AttentionRow:
    b, h, t, d = shape
    m = kernels.get_method(method)
    prov = m.provides("attention")
    qkv_op = layout == "qkv" and m.provides("attention_qkv") == "native"
    provided = prov if layout == "separate" else "native (qkv)" if qkv_op else f"{prov}, split"
    row = AttentionRow(label or method, provided, b, h, t, d, layout=layout)
    if prov == "composed" and b * h * t * t * 2 / 2**30 > MAX_SCORES_GIB:
        row.error = f"skipped: the {b}x{h}x{t}x{t} scores would take over {MAX_SCORES_GIB:.0f} GiB"
        return row
    try:
        g = torch.Generator(device=device).manual_seed(0)
        if layout == "qkv":  # one projection output and its gradient, as the model has them
            qkv = torch.randn((b, t, 3 * h * d), device=device, generator=g).to(torch.bfloat16).requires_grad_(True)
            inputs = (qkv,)
            if qkv_op:
                fn_qkv = kernels.bind(method, "attention_qkv", **(options or {}))
                call = lambda: fn_qkv(qkv, h, None, True, 0.0)  # noqa: E731
            else:
                fn = kernels.bind(method, "attention", **(options or {}))
                call = lambda: fn(*split_qkv(qkv, h), None, True, 0.0)  # noqa: E731
            heads = split_qkv(qkv.detach()[:1], h)
        else:
            fn = kernels.bind(method, "attention", **(options or {}))
            inputs = tuple(torch.randn(shape, device=device, generator=g).to(torch.bfloat16).requires_grad_(True)
                           for _ in range(3))
            call = lambda: fn(*inputs, None, True, 0.0)  # noqa: E731
            heads = tuple(x.detach()[:1] for x in inputs)
        do = torch.randn(shape, device=device, generator=g).to(torch.bfloat16)
        out = call()
        ref = kernels.reference_attention(*(x[:, :1] for x in heads))
        row.correct = kernels.relative_error(out.detach()[:1, :1], ref) <= kernels.ATTN_FWD_TOL[torch.bfloat16]
        torch.autograd.grad(out, inputs, do)  # warm the backward (compile) too
        del out, ref

        def forward():
            with torch.no_grad():
                return call()

        def forward_backward():
            return torch.autograd.grad(call(), inputs, do)

        row.fwd_ms, row.fwd_graph_ms = eager_and_graph_ms(forward, rep_ms)
        row.fwd_bwd_ms, row.fwd_bwd_graph_ms = eager_and_graph_ms(forward_backward, rep_ms)
        row.fwd_host_us, row.fwd_bwd_host_us = issue_us(forward), issue_us(forward_backward)
        f = causal_flops(b, h, t, d)
        tf = lambda flops, ms: None if ms is None else flops / (ms * 1e-3) / 1e12  # noqa: E731
        row.fwd_tflops, row.fwd_graph_tflops = tf(f, row.fwd_ms), tf(f, row.fwd_graph_ms)
        row.fwd_bwd_tflops, row.fwd_bwd_graph_tflops = tf(3.5 * f, row.fwd_bwd_ms), tf(3.5 * f, row.fwd_bwd_graph_ms)
        row.extra_gib = peak_extra_gib(forward_backward)
    except Exception as exc:
        row.error = error_text(exc)
    finally:
        free_memory()
    return row


def run_attention_bench(methods: Optional[list[str]], shapes: list[tuple], out: Path, rep_ms: int = 100,
                        layout: str = "separate") -> list:
    if layout not in LAYOUTS:
        raise ValueError(f"attention bench layout {layout!r} is not accepted: one of {', '.join(LAYOUTS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for shape in shapes:
        for method in methods or default_methods():
            for label, options in variants(method):
                r = measure_attention(method, shape, device, rep_ms, options, label, layout)
                rows.append(r)
                print(f"  {label:24s} {shape}: fwd {fmt(r.fwd_tflops)} (graph {fmt(r.fwd_graph_tflops)}) TFLOP/s, fwd+bwd "
                      f"{fmt(r.fwd_bwd_tflops)} (graph {fmt(r.fwd_bwd_graph_tflops)}), extra {fmt(r.extra_gib, '.2f')} "
                      f"GiB, host {fmt(r.fwd_host_us)}/{fmt(r.fwd_bwd_host_us)} us "
                      f"{'ok' if r.correct else r.error or 'WRONG'}", flush=True)
    env = environment()
    how = ("inputs q, k, v, three gradients" if layout == "separate" else
           "inputs one projection (B, T, 3 H d) and its gradient: a native attention_qkv, else the attention on "
           "its split views (the backward then concatenates three gradients)")
    lines = [f"## Causal attention on {env['device_name']} (torch {env['torch']}, triton {env['triton']}), bf16, "
             f"{how}", "",
             "TFLOP/s: forward 4*B*H*T^2*d/2, forward + backward 3.5x that. Eager (launch cost included) and graph "
             "replay (kernels alone). Host us: the host's time to issue one forward / forward + backward; where it nears the "
             "eager ms, the GPU waited on the host.", "",
             "| method | provided | B, H, T, d | fwd TFLOP/s eager | fwd graph | fwd+bwd TFLOP/s eager | fwd+bwd graph "
             "| fwd ms | fwd+bwd ms | host us fwd / fwd+bwd | extra GiB | correct |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "yes" if r.correct else ("**NO**" if r.correct is False else r.error)
        lines.append(f"| {r.method} | {r.provided} | {r.b}, {r.h}, {r.t}, {r.d} | {fmt(r.fwd_tflops)} "
                     f"| {fmt(r.fwd_graph_tflops)} | {fmt(r.fwd_bwd_tflops)} | {fmt(r.fwd_bwd_graph_tflops)} "
                     f"| {fmt(r.fwd_ms, '.3f')} | {fmt(r.fwd_bwd_ms, '.3f')} | {fmt(r.fwd_host_us)} / "
                     f"{fmt(r.fwd_bwd_host_us)} | {fmt(r.extra_gib, '.2f')} | {ok} |")
    md = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    stem = "attention" if layout == "separate" else f"attention-{layout}"  # (one layout does not overwrite the other)
    atomic_write_text(out / f"{stem}.md", md)
    write_rows_csv(rows, out / f"{stem}.csv")
    write_json(out / f"{stem}.json", {"env": env, "layout": layout, "rows": [asdict(r) for r in rows]})
    print(md)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="", help="comma-separated methods (default: every attention method)")
    p.add_argument("--shapes", default="16,12,1024,64;4,12,4096,64;1,12,16384,64;8,16,2048,128",
                   help="B,H,T,d shapes separated by ';'")
    p.add_argument("--layout", default="separate", choices=LAYOUTS,
                   help="separate: q, k, v and their three gradients; qkv: one projection output and its gradient, "
                   "as the model calls attention (a method's native attention_qkv, else its attention on split views)")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list:
    shapes = parse_shapes(error, "--shapes", a.shapes, 4)
    return run_attention_bench(runnable(parse_names(a.methods), "attention"), shapes, a.out, a.rep_ms, a.layout)
