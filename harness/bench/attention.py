"""``python -m harness.bench attention``: the attention table.

Causal bf16 attention at shapes (B, H, T, d), or (B, H, Hkv, T, d) with Hkv key/value heads shared by
groups of H / Hkv query heads (grouped-query attention, as the ``attention`` contract takes it: k and v
unexpanded), or at each model config's own shape (``--models``: :mod:`harness.bench.model_shapes`), for
every method that provides attention (by default every one that can run here): the materialized
methods by composition (q k^T -> their softmax -> v; skipped where the T x T scores would exceed
``MAX_SCORES_GIB``), the fused ones natively (sdpa's backends, flex, flash). A method that refuses the
inputs (sdpa's efficient and cuDNN backends on grouped heads) gets a row with its reason. TFLOP/s
counts 4 * B * H * T^2 * d / 2 for a causal forward (half the square; H the query heads, whatever Hkv:
they do the work) and 3.5x that for forward + backward (the backward's five matmuls against the
forward's two, the causal half likewise), whatever a method really computes. Eager and graph-replay
timings and the host's issue time as in the softmax table; the extra memory is the peak allocated
during forward + backward above the inputs. Each method's output is checked against float64 first, on
the first and last query heads of the first key/value head's group; a wrong result is marked.

``layout``: "separate" (q, k, v three tensors, their three gradients: the op alone) or "qkv" (as the model
calls it: one projection output (B, T, (H + 2 Hkv) d) and its gradient; a method's native ``attention_qkv``
where it has one, given n_kv_head where Hkv < H, else its attention on the split views, whose backward
concatenates the three gradients, a copy that the TFLOP/s then include); its files are attention-qkv.md,
.csv and .json.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import torch

import kernels
from kernels.contract import split_qkv
from kernels.runtime import fastlaunch
from harness.bench.common import (eager_and_graph_ms, error_text, fmt, free_memory, issue_us, parse_names, parse_shapes,
                                  peak_extra_gib, runnable, write_rows_csv)
from harness.bench.model_shapes import ModelShape, models_option
from harness.env import environment, switches_text
from harness.results import atomic_write_text, write_json

MAX_SCORES_GIB = 4.0
LAYOUTS = ("separate", "qkv")
DEFAULT_SHAPES = "16,12,1024,64;4,12,4096,64;1,12,16384,64;8,16,2048,128"


@dataclass
class AttentionRow:
    method: str  # the method, with its options in brackets (sdpa[backend=cudnn])
    provided: str  # native | composed; layout qkv: native (qkv) | native, split | composed, split
    b: int
    h: int
    hkv: int  # key/value heads (h: multi-head attention)
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
    model: str = ""  # the model config whose shape this is (--models), else ''
    launches: str = ""  # the Triton launches of one forward + backward after the timings, by path (fastlaunch.counts)


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


def attention_shape(shape: tuple) -> tuple[int, int, int, int, int]:
    """(B, H, Hkv, T, d) of a shape of 4 numbers (B, H, T, d: Hkv = H) or 5 (B, H, Hkv, T, d); a ValueError
    saying what is accepted for any other count, a size below 1 or an Hkv that does not divide H."""
    if len(shape) not in (4, 5):
        raise ValueError(f"an attention shape is B,H,T,d or B,H,Hkv,T,d (4 or 5 integers); got {tuple(shape)}")
    b, h, kv, t, d = shape if len(shape) == 5 else (shape[0], shape[1], shape[1], shape[2], shape[3])
    if min(shape) < 1 or h % kv:
        raise ValueError(f"attention shape {tuple(shape)}: every size must be >= 1 and Hkv must divide H (query head "
                         f"h reads key/value head h // (H / Hkv)); got H={h}, Hkv={kv}")
    return int(b), int(h), int(kv), int(t), int(d)


def causal_flops(b: int, h: int, t: int, d: int) -> float:
    """A causal forward's FLOPs with H query heads (grouped k and v change nothing: every query head's
    two matmuls run)."""
    return 4.0 * b * h * t * t * d / 2


def _inputs(method: str, shape: tuple, device: str, options: dict, layout: str, qkv_op: bool) -> tuple:
    """(call, inputs, heads): the call to time, the tensors whose gradients it computes, and batch 0's q, k,
    v (views) for the float64 check."""
    b, h, kv, t, d = shape
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, device=device, generator=g).to(torch.bfloat16).requires_grad_(True)

    if layout == "separate":
        fn = kernels.bind(method, "attention", **options)
        inputs = (randn(b, h, t, d), randn(b, kv, t, d), randn(b, kv, t, d))  # k, v unexpanded: the contract's GQA
        return (lambda: fn(*inputs, None, True, 0.0)), inputs, tuple(x.detach()[:1] for x in inputs)
    qkv = randn(b, t, (h + 2 * kv) * d)  # one projection output and its gradient, as the model has them
    n_kv = kv if kv < h else None  # (as the models' attend_qkv: n_kv_head only where grouped; None means H)
    if qkv_op:
        fn_qkv = kernels.bind(method, "attention_qkv", **options)
        call = lambda: fn_qkv(qkv, h, None, True, 0.0, n_kv)  # noqa: E731
    else:
        fn = kernels.bind(method, "attention", **options)
        call = lambda: fn(*split_qkv(qkv, h, n_kv), None, True, 0.0)  # noqa: E731
    return call, (qkv,), split_qkv(qkv.detach()[:1], h, n_kv)


def _check(out: torch.Tensor, heads: tuple) -> bool:
    """Batch 0's output on the first and last query heads of key/value head 0's group against float64
    (query head h reads key/value head h // (H / Hkv): a wrong grouping fails)."""
    q, k, v = heads
    idx = sorted({0, q.shape[1] // k.shape[1] - 1})
    ref = kernels.reference_attention(q[:, idx], k[:, :1], v[:, :1])
    return kernels.relative_error(out.detach()[:1, idx], ref) <= kernels.ATTN_FWD_TOL[torch.bfloat16]


def measure_attention(method: str, shape: tuple, device: str, rep_ms: int, options: Optional[dict] = None,
                      label: Optional[str] = None, layout: str = "separate", model: str = "") -> AttentionRow:
    """One row: ``shape`` (B, H, T, d) or (B, H, Hkv, T, d); ``model`` names the config it came from."""
    b, h, kv, t, d = shape = attention_shape(shape)
    m = kernels.get_method(method)
    prov = m.provides("attention")
    qkv_op = layout == "qkv" and m.provides("attention_qkv") == "native"
    provided = prov if layout == "separate" else "native (qkv)" if qkv_op else f"{prov}, split"
    row = AttentionRow(label or method, provided, b, h, kv, t, d, layout=layout, model=model)
    if prov == "composed" and b * h * t * t * 2 / 2**30 > MAX_SCORES_GIB:
        row.error = f"skipped: the {b}x{h}x{t}x{t} scores would take over {MAX_SCORES_GIB:.0f} GiB"
        return row
    try:
        call, inputs, heads = _inputs(method, shape, device, options or {}, layout, qkv_op)
        do = torch.randn((b, h, t, d), device=device, generator=torch.Generator(device=device).manual_seed(1))
        do = do.to(torch.bfloat16)
        try:
            out = call()
        except ValueError as exc:  # the method refuses these inputs (sdpa's efficient backend on grouped heads)
            row.error = f"refused: {exc}"
            return row
        row.correct = _check(out, heads)
        torch.autograd.grad(out, inputs, do)  # warm the backward (compile) too
        del out

        def forward():
            with torch.no_grad():
                return call()

        def forward_backward():
            return torch.autograd.grad(call(), inputs, do)

        row.fwd_ms, row.fwd_graph_ms = eager_and_graph_ms(forward, rep_ms)
        row.fwd_bwd_ms, row.fwd_bwd_graph_ms = eager_and_graph_ms(forward_backward, rep_ms)
        row.fwd_host_us, row.fwd_bwd_host_us = issue_us(forward), issue_us(forward_backward)
        fastlaunch.reset_counts()  # (what the timed calls launched by: prepared, direct or kernel[grid], and why)
        forward_backward()
        row.launches = fastlaunch.describe_counts(fastlaunch.counts())
        f = causal_flops(b, h, t, d)  # (the query heads': grouped k and v do not change the work)
        tf = lambda flops, ms: None if ms is None else flops / (ms * 1e-3) / 1e12  # noqa: E731
        row.fwd_tflops, row.fwd_graph_tflops = tf(f, row.fwd_ms), tf(f, row.fwd_graph_ms)
        row.fwd_bwd_tflops, row.fwd_bwd_graph_tflops = tf(3.5 * f, row.fwd_bwd_ms), tf(3.5 * f, row.fwd_bwd_graph_ms)
        row.extra_gib = peak_extra_gib(forward_backward)
    except Exception as exc:
        row.error = error_text(exc)
    return row


def run_attention_bench(methods: Optional[list[str]], shapes: list[Union[tuple, ModelShape]], out: Path,
                        rep_ms: int = 100, layout: str = "separate") -> list:
    """The table at ``shapes``: (B, H, T, d) or (B, H, Hkv, T, d) tuples, or model configs' shapes
    (:class:`ModelShape`, their rows named after the model); every shape is checked before any work."""
    if layout not in LAYOUTS:
        raise ValueError(f"attention bench layout {layout!r} is not accepted: one of {', '.join(LAYOUTS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    points = [(s.name, s.attention) if isinstance(s, ModelShape) else ("", attention_shape(s)) for s in shapes]
    rows = []
    for model, shape in points:
        for method in methods or default_methods():
            for label, options in variants(method):
                r = measure_attention(method, shape, device, rep_ms, options, label, layout, model)
                # the row's memory handed back once its frame is gone (its inputs, closures and any exception's
                # traceback): from within, they were all still referenced and nothing was returned
                free_memory()
                rows.append(r)
                where = f"{model} {shape}" if model else str(shape)
                print(f"  {label:24s} {where}: fwd {fmt(r.fwd_tflops)} (graph {fmt(r.fwd_graph_tflops)}) TFLOP/s, fwd+bwd "
                      f"{fmt(r.fwd_bwd_tflops)} (graph {fmt(r.fwd_bwd_graph_tflops)}), extra {fmt(r.extra_gib, '.2f')} "
                      f"GiB, host {fmt(r.fwd_host_us)}/{fmt(r.fwd_bwd_host_us)} us, Triton launches {r.launches or '-'} "
                      f"{'ok' if r.correct else r.error or 'WRONG'}", flush=True)
    env = environment()
    how = ("inputs q (B, H, T, d), k and v (B, Hkv, T, d), three gradients" if layout == "separate" else
           "inputs one projection (B, T, (H + 2 Hkv) d) and its gradient: a native attention_qkv, else the attention "
           "on its split views (the backward then concatenates three gradients)")
    lines = [f"## Causal attention on {env['device_name']} (torch {env['torch']}, triton {env['triton']}{switches_text(env)}), bf16, "
             f"{how}", "",
             "TFLOP/s: forward 4*B*H*T^2*d/2 (H query heads, whatever Hkv), forward + backward 3.5x that. Eager "
             "(launch cost included) and graph "
             "replay (kernels alone). Host us: the host's time to issue one forward / forward + backward; where it nears the "
             "eager ms, the GPU waited on the host. Triton launches: those of one forward + backward after the timings, by "
             "path (prepared or direct: the compiled kernel's launcher called directly; plain: through kernel[grid], and why).",
             "",
             "| method | provided | B, H, Hkv, T, d | fwd TFLOP/s eager | fwd graph | fwd+bwd TFLOP/s eager | fwd+bwd graph "
             "| fwd ms | fwd+bwd ms | host us fwd / fwd+bwd | extra GiB | correct | Triton launches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "yes" if r.correct else ("**NO**" if r.correct is False else r.error)
        shape = f"{r.b}, {r.h}, {r.hkv}, {r.t}, {r.d}" + (f" ({r.model})" if r.model else "")
        lines.append(f"| {r.method} | {r.provided} | {shape} | {fmt(r.fwd_tflops)} "
                     f"| {fmt(r.fwd_graph_tflops)} | {fmt(r.fwd_bwd_tflops)} | {fmt(r.fwd_bwd_graph_tflops)} "
                     f"| {fmt(r.fwd_ms, '.3f')} | {fmt(r.fwd_bwd_ms, '.3f')} | {fmt(r.fwd_host_us)} / "
                     f"{fmt(r.fwd_bwd_host_us)} | {fmt(r.extra_gib, '.2f')} | {ok} | {r.launches or '-'} |")
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
    p.add_argument("--shapes", default=None,
                   help="B,H,T,d or B,H,Hkv,T,d shapes (Hkv key/value heads dividing H: grouped-query attention) "
                   f"separated by ';' (default {DEFAULT_SHAPES})")
    p.add_argument("--models", default=None,
                   help="comma-separated model configs (conf/model/, e.g. smollm2_135m,qwen25_05b,llama32_1b): each "
                   "model's (B, H, Hkv, T, d), B its data.batch_size and T its context (one step's tokens), instead "
                   "of --shapes")
    p.add_argument("--layout", default="separate", choices=LAYOUTS,
                   help="separate: q, k, v and their three gradients; qkv: one projection output and its gradient, "
                   "as the model calls attention (a method's native attention_qkv, else its attention on split views)")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--out", default="outputs/bench", type=Path)


def shapes_of(a: argparse.Namespace, error: Callable[[str], None]) -> list:
    """The shapes of the command line: --models' or --shapes' (the default shapes without either)."""
    models = models_option(a, error, {"--shapes": a.shapes})
    if models is not None:
        return models
    shapes = parse_shapes(error, "--shapes", DEFAULT_SHAPES if a.shapes is None else a.shapes, (4, 5))
    try:
        return [attention_shape(s) for s in shapes]
    except ValueError as exc:
        error(f"--shapes: {exc}")


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list:
    shapes = shapes_of(a, error)
    return run_attention_bench(runnable(parse_names(a.methods), "attention"), shapes, a.out, a.rep_ms, a.layout)
