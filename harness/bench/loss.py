"""``python -m harness.bench loss``: the loss-softmax table.

Cross-entropy forward + backward on (tokens, V) logits in bf16 for every method that provides it
(by default every one that can run here), with ``torch`` also under bf16 autocast (what a model's
loss costs there: autocast runs the cross-entropy on an fp32 copy of the logits). Reported: eager and
graph-replay ms of forward + backward and of the forward alone, the fraction of the ideal (one read of
the logits and one write of their gradient at the copy bandwidth measured in the same run), and the
extra memory (peak allocated during forward + backward above what was allocated before, the
gradient included). Then the linear cross-entropy (hidden (tokens, C) @ weight (V, C).T, no full
logits for the methods that implement it natively: the project's, Liger's and Apple's Cut
Cross-Entropy, ``cce``, which has no cross-entropy on the logits and so appears in these rows alone).
Every method's loss and gradient are checked against float64 on the first rows first; a wrong result
gets no ratio. On a GPU each vocabulary's rows, and each linear shape's, are measured in a fresh process
(``_isolated``): what one row leaves on the device cannot starve the next; within a group each row is released
(``_released``) before the next, and ``held_gib`` says what it left behind all the same.

The shapes (vocabularies at a token count and linear (tokens, C, V) shapes, or each model config's:
its vocabulary, hidden size and one step's tokens, the rows named after it): :mod:`harness.bench.loss_shapes`.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

import torch

import kernels
from harness.bench.common import (eager_and_graph_ms, error_text, fmt, free_memory, issue_us, parse_names, peak_extra_gib,
                                  runnable, write_rows_csv)
from harness.bench.loss_shapes import add_shape_arguments, loss_shapes, shapes_of
from harness.bench.model_shapes import ModelShape
from harness.bench.timing import copy_bandwidth
from harness.env import environment, switches_text
from harness.results import atomic_write_text, write_json

CHECK_ROWS = 256


@dataclass
class LossRow:
    method: str
    op: str  # cross_entropy | linear_cross_entropy
    tokens: int
    vocab: int
    hidden: int = 0
    autocast: bool = False
    fwd_bwd_ms: Optional[float] = None  # eager
    fwd_bwd_graph_ms: Optional[float] = None
    fwd_ms: Optional[float] = None
    fwd_bwd_host_us: Optional[float] = None  # host time to issue one forward + backward (common.issue_us)
    ideal_ms: Optional[float] = None
    frac_ideal: Optional[float] = None  # ideal / eager forward + backward
    extra_gib: Optional[float] = None
    held_gib: Optional[float] = None  # GPU memory in use once the row was released (_released), beyond its group's start
    correct: Optional[bool] = None
    error: str = ""
    model: str = ""  # the model config(s) whose shape this is (--models), else ''


def default_methods(op: str = "cross_entropy") -> list[str]:
    return [n for n, a in kernels.available_methods(op=op).items() if a.available]


def _check(loss_rows: torch.Tensor, grad: Optional[torch.Tensor], logits: torch.Tensor, t: torch.Tensor) -> bool:
    """The first rows' losses (reduction none) and the mean-loss gradient against float64."""
    x = logits[:CHECK_ROWS].double()
    ref = torch.nn.functional.cross_entropy(x, t[:CHECK_ROWS], reduction="none")
    ok = kernels.relative_error(loss_rows[:CHECK_ROWS], ref) <= 4e-3  # a loss rounded to bf16 is not wrong
    if grad is not None:
        g = torch.softmax(x, -1)
        g[torch.arange(len(x), device=x.device), t[:CHECK_ROWS]] -= 1
        g /= t.numel()
        ok = ok and kernels.relative_error(grad[:CHECK_ROWS], g) <= kernels.BWD_TOL[logits.dtype]
    return ok


def measure_ce(method: str, tokens: int, vocab: int, device: str, rep_ms: int, autocast: bool = False,
               model: str = "") -> LossRow:
    row = LossRow(method, "cross_entropy", tokens, vocab, autocast=autocast, model=model)
    ctx = (lambda: torch.autocast("cuda", torch.bfloat16)) if autocast else contextlib.nullcontext
    try:
        fn = kernels.bind(method, "cross_entropy")
        g = torch.Generator(device=device).manual_seed(0)
        logits = (torch.randn(tokens, vocab, device=device, generator=g) * 2).to(torch.bfloat16).requires_grad_(True)
        t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
        with ctx():
            rows_loss = fn(logits.detach(), t, -100, "none")
            grad, = torch.autograd.grad(fn(logits, t, -100, "mean"), logits)
        row.correct = _check(rows_loss.detach().float(), grad, logits.detach(), t)
        del rows_loss, grad

        def forward_backward():
            with ctx():
                return torch.autograd.grad(fn(logits, t, -100, "mean"), logits)

        def forward():
            with torch.no_grad(), ctx():
                return fn(logits, t, -100, "mean")

        key = f"cross_entropy:{method}:{autocast}"
        row.fwd_bwd_ms, row.fwd_bwd_graph_ms = eager_and_graph_ms(forward_backward, rep_ms, key)
        row.fwd_ms, _ = eager_and_graph_ms(forward, rep_ms, key)
        row.fwd_bwd_host_us = issue_us(forward_backward)
        row.extra_gib = peak_extra_gib(forward_backward)
    except Exception as exc:
        row.error = error_text(exc)
    return row


def _released(row: LossRow) -> LossRow:
    """``row`` (just returned by ``measure_ce`` or ``measure_linear``) with its held_gib, read once what measured it
    is gone: their frame, and with it the row's inputs, closures and graphs and a caught exception's traceback (called
    from within, the inputs were dropped but the closures, the bound method and anything a traceback held were not),
    the garbage collected and the allocator's cache emptied, so the next row starts from an empty GPU."""
    free_memory()
    row.held_gib = held_gib()
    return row


def held_gib() -> Optional[float]:
    """GiB of the GPU in use after a row, its tensors freed and the allocator's cache emptied (None without
    a GPU): the inputs of the next row aside, what something failed to give back. Read from the device
    (total - free), so memory held outside PyTorch's allocator (CUDA graphs, libraries) counts too."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def measure_linear(method: str, tokens: int, hidden: int, vocab: int, device: str, rep_ms: int,
                   model: str = "") -> LossRow:
    row = LossRow(method, "linear_cross_entropy", tokens, vocab, hidden=hidden, model=model)
    try:
        fn = kernels.bind(method, "linear_cross_entropy")
        g = torch.Generator(device=device).manual_seed(0)
        h = torch.randn(tokens, hidden, device=device, generator=g).to(torch.bfloat16).requires_grad_(True)
        w = (torch.randn(vocab, hidden, device=device, generator=g) * 0.02).to(torch.bfloat16).requires_grad_(True)
        t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
        loss = fn(h, w, t, -100, "mean")
        ref = torch.nn.functional.cross_entropy(h.detach()[:CHECK_ROWS].double() @ w.detach().double().T,
                                                t[:CHECK_ROWS], reduction="sum") / tokens
        part = fn(h.detach()[:CHECK_ROWS], w.detach(), t[:CHECK_ROWS], -100, "sum") / tokens
        row.correct = kernels.relative_error(part.float(), ref) <= 1e-2 and bool(torch.isfinite(loss).item())
        del loss

        def forward_backward():
            return torch.autograd.grad(fn(h, w, t, -100, "mean"), (h, w))

        row.fwd_bwd_ms, row.fwd_bwd_graph_ms = eager_and_graph_ms(forward_backward, rep_ms,
                                                                  f"linear_cross_entropy:{method}")
        row.fwd_bwd_host_us = issue_us(forward_backward)
        row.extra_gib = peak_extra_gib(forward_backward)
    except Exception as exc:
        row.error = error_text(exc)
    return row


def _held_since(rows: list[LossRow], start: Optional[float]) -> list[LossRow]:
    """held_gib relative to what the device had in use when the group began (this process's context
    and, under isolation, the parent's): what each row left behind."""
    if start is not None:
        for r in rows:
            if r.held_gib is not None:
                r.held_gib -= start
    return rows


def _vocab_rows(methods: Optional[list[str]], tokens: int, v: int, model: str, device: str,
                rep_ms: int) -> list[LossRow]:
    """Every method's cross-entropy on (tokens, v) logits (``torch`` also under autocast)."""
    start = held_gib()
    rows = []
    for m in [x for x in methods if kernels.get_method(x).provides("cross_entropy")] if methods else default_methods():
        rows.append(_released(measure_ce(m, tokens, v, device, rep_ms, model=model)))
        if m == "torch":  # what a model's loss costs under autocast
            rows.append(_released(measure_ce(m, tokens, v, device, rep_ms, autocast=True, model=model)))
    return _held_since(rows, start)


def _linear_rows(methods: Optional[list[str]], tok: int, c: int, v: int, model: str, device: str,
                 rep_ms: int) -> list[LossRow]:
    """Every method's linear cross-entropy at (tokens, C, V): by default every one that can run here,
    the peers (liger, cce) included."""
    lin_methods = ([x for x in methods if kernels.get_method(x).provides("linear_cross_entropy")] if methods
                   else default_methods("linear_cross_entropy"))
    start = held_gib()
    return _held_since([_released(measure_linear(m, tok, c, v, device, rep_ms, model)) for m in lin_methods], start)


def _isolated(isolate: bool, fn, *args) -> list[LossRow]:
    """``fn(*args)``, in a fresh process when ``isolate`` (on a GPU): one group's rows cannot leave memory behind for the next
    (in one process the 32768 and 50304 rows ran out of memory after the larger ones while PyTorch held
    1-4 GiB and the device 139 GiB: graph pools and library caches that no ``empty_cache`` returned). A
    child that dies (a device-side assert, a crash) costs its group only: the rows say so."""
    if not isolate:
        return fn(*args)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def run_loss_bench(methods: Optional[list[str]], vocabs: list[int], tokens: int, linear: Union[None, tuple, list[tuple]],
                   out: Path, rep_ms: int = 100, isolate: Optional[bool] = None,
                   models: Iterable[ModelShape] = ()) -> list[LossRow]:
    """The table (shapes: :func:`loss_shapes`); each vocabulary's rows and each linear shape's measured in
    a process of their own when ``isolate`` (None: on a GPU)."""
    ce, lin = loss_shapes(vocabs, tokens, linear, models)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    isolate = device == "cuda" if isolate is None else isolate
    copy_gbs = copy_bandwidth(device, nbytes=2**30 if device == "cuda" else 2**22)
    free_memory()
    rows: list[LossRow] = []
    env = environment()

    def done(group: list[LossRow]) -> None:
        """A group's rows printed as soon as they are measured, and the table so far written (a bench stopped
        at a time limit leaves what it measured)."""
        for r in group:
            if r.op == "cross_entropy":
                r.ideal_ms = 2 * r.tokens * r.vocab * 2 / (copy_gbs * 1e9) * 1e3
                if r.fwd_bwd_ms and r.correct:
                    r.frac_ideal = r.ideal_ms / r.fwd_bwd_ms
            print_row(r)
        rows.extend(group)
        rows.sort(key=lambda r: (r.op != "cross_entropy", r.vocab if r.op == "cross_entropy" else 0))  # (stable)
        write_loss_table(rows, env, copy_gbs, out)

    for (n, v), model in sorted(ce.items(), key=lambda item: -item[0][1]):
        try:
            done(_isolated(isolate, _vocab_rows, methods, n, v, model, device, rep_ms))
        except Exception as exc:  # the child died: its group gets one row that says how
            done([LossRow("(all)", "cross_entropy", n, v, model=model,
                          error=f"the measuring process failed: {error_text(exc)}")])
    for (n, c, v), model in lin.items():
        try:
            done(_isolated(isolate, _linear_rows, methods, n, c, v, model, device, rep_ms))
        except Exception as exc:
            done([LossRow("(all)", "linear_cross_entropy", n, v, hidden=c, model=model,
                          error=f"the measuring process failed: {error_text(exc)}")])
    print(write_loss_table(rows, env, copy_gbs, out))
    return rows


def print_row(r: LossRow) -> None:
    print(f"  {r.method:8s}{'+autocast' if r.autocast else '':9s} {r.op:21s} {r.tokens}x{r.vocab}"
          f"{f' ({r.hidden})' if r.hidden else ''}{f' {r.model}' if r.model else ''}: fwd+bwd "
          f"{fmt(r.fwd_bwd_ms, '.3f')} ms (graph {fmt(r.fwd_bwd_graph_ms, '.3f')}), ideal {fmt(r.ideal_ms, '.3f')}, "
          f"extra {fmt(r.extra_gib, '.2f')} GiB, left on the GPU {fmt(r.held_gib, '.2f')} GiB "
          f"{r.error or ('ok' if r.correct else 'WRONG')}", flush=True)


def write_loss_table(rows: list[LossRow], env: dict, copy_gbs: float, out: Path) -> str:
    """loss.md, loss.csv and loss.json of ``rows`` in ``out``; the markdown table returned."""
    lines = [f"## Cross-entropy on {env['device_name']} (torch {env['torch']}, triton {env['triton']}{switches_text(env)}), bf16 logits", "",
             f"Copy ceiling {copy_gbs:.0f} GB/s; ideal = one read of the logits + one write of their gradient at it. "
             "Host us: the host's time to issue one forward + backward; where it nears the eager ms, the GPU waited "
             "on the host.", "",
             "| method | op | tokens x V (C) [model] | fwd+bwd ms eager | fwd+bwd ms graph | fwd ms | ideal ms | ideal / eager "
             "| host us | extra GiB | left on the GPU GiB | correct |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r.tokens} x {r.vocab}" + (f" ({r.hidden})" if r.hidden else "") + (f" [{r.model}]" if r.model else "")
        ok = f"error: {r.error}" if r.error else ("yes" if r.correct else "**NO**")
        lines.append(f"| {r.method}{' (autocast)' if r.autocast else ''} | {r.op} | {shape} | {fmt(r.fwd_bwd_ms, '.3f')} "
                     f"| {fmt(r.fwd_bwd_graph_ms, '.3f')} | {fmt(r.fwd_ms, '.3f')} | {fmt(r.ideal_ms, '.3f')} "
                     f"| {fmt(r.frac_ideal, '.2f')} | {fmt(r.fwd_bwd_host_us)} | {fmt(r.extra_gib, '.2f')} | {fmt(r.held_gib, '.2f')} | {ok} |")
    md = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "loss.md", md)
    write_rows_csv(rows, out / "loss.csv")
    write_json(out / "loss.json", {"env": env, "copy_gbs": copy_gbs, "rows": [asdict(r) for r in rows]})
    return md


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="", help="comma-separated methods (default: every cross-entropy method, and "
                   "in the linear rows every linear cross-entropy method: liger, cce where they run)")
    add_shape_arguments(p)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[LossRow]:
    vocabs, tokens, lin, models = shapes_of(a, error)
    # with linear rows, a method with a linear cross-entropy alone (cce) is kept for them; the others provide both
    methods = runnable(parse_names(a.methods), "linear_cross_entropy" if lin or models else "cross_entropy")
    return run_loss_bench(methods, vocabs, tokens, lin, a.out, a.rep_ms, models=models)
