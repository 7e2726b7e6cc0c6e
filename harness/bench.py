"""Benchmarks: ``python -m harness.bench kernels`` and ``python -m harness.bench overhead`` (plus the launch
sweeps ``triton-sweep`` and ``cuda-sweep`` that the kernels' launch tables come from).

``kernels``: every softmax method, forward and backward separately, against the device-to-device copy
bandwidth measured in the same run. GB/s counts 2 x tensor bytes forward (read x, write y) and 3 x
backward (read y and dy, write dx), whatever the method really moves, so a method that moves more
bytes shows as a lower effective bandwidth. Timing: ``triton.testing.do_bench`` (CUDA events, L2
flushed between repetitions, median) after a warm-up that includes any compilation. Backward is timed
through ``torch.autograd.grad`` on a retained graph, the same way for every method. Each method's
forward is checked against a float32 reference on the benchmark input first; a wrong result is marked
and no ratio is reported for it. Writes CSV, markdown and a PNG chart of GB/s against N.

``overhead``: the harness's training throughput with the ``torch`` method against a bare PyTorch loop
training the same model the same way (same model code, AdamW fused, bf16 autocast, gradient clipping,
same batches), alternating the two, in the same process.

On a CPU both run at tiny sizes with a wall-clock timer: the numbers mean nothing there; it only
checks the plumbing.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import kernels
from harness.results import atomic_write_text, write_json
from kernels.timing import bench_graph_ms, bench_ms, copy_bandwidth, error_on_device, sweep_references, write_bandwidth

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_SIZES = "128,256,512,1024,2048,4096,8192,16384,32768,65536,262144"


@dataclass
class KernelRow:
    method: str
    dtype: str
    n: int
    rows: int
    causal: bool
    fwd_ms: Optional[float] = None
    bwd_ms: Optional[float] = None
    fwd_gbs: Optional[float] = None
    bwd_gbs: Optional[float] = None
    fwd_frac_copy: Optional[float] = None
    bwd_frac_copy: Optional[float] = None
    fwd_vs_best_baseline: Optional[float] = None  # GB/s ratio to the faster of torch and compile
    bwd_vs_best_baseline: Optional[float] = None
    correct: Optional[bool] = None
    graph_timed: bool = False  # True: CUDA-graph replay (kernel time); False: timed with launch overhead
    error: str = ""


def _check_forward(y: torch.Tensor, x: torch.Tensor, scale: float, causal: bool, dtype: torch.dtype) -> bool:
    ref = kernels.reference_softmax(x, scale=scale, causal=causal)  # float64 on the device
    return error_on_device(y, ref) <= kernels.FWD_TOL[dtype]


def measure_method(
    method: str, shape: tuple, dtype: torch.dtype, scale: float, causal: bool, device: str, rep_ms: int
) -> KernelRow:
    n = shape[-1]
    rows = int(torch.Size(shape).numel() // n)
    row = KernelRow(method, str(dtype).replace("torch.", ""), n, rows, causal)
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

        # backward = (forward + backward) - forward: both captured the same way, so the autograd
        # backward runs on the capturing stream
        row.fwd_ms, g1 = bench_graph_ms(forward, rep_ms)
        fb_ms, g2 = bench_graph_ms(forward_backward, rep_ms)
        row.bwd_ms = max(fb_ms - row.fwd_ms, 1e-6)
        row.graph_timed = g1 and g2
        nbytes = x.numel() * x.element_size()
        row.fwd_gbs = 2 * nbytes / (row.fwd_ms * 1e-3) / 1e9
        row.bwd_gbs = 3 * nbytes / (row.bwd_ms * 1e-3) / 1e9
        del x, dy
    except Exception as exc:  # one failing method must not stop the table
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def fill_ratios(rows: list[KernelRow], copy_gbs: float) -> None:
    baseline = ("torch", "compile")
    for r in rows:
        if r.fwd_gbs:
            r.fwd_frac_copy = r.fwd_gbs / copy_gbs
        if r.bwd_gbs:
            r.bwd_frac_copy = r.bwd_gbs / copy_gbs
        peers = [p for p in rows if p.method in baseline and (p.dtype, p.n, p.causal, p.rows) == (r.dtype, r.n, r.causal, r.rows)
                 and p.correct]
        if not r.correct:
            continue  # no speedup reported for a wrong result
        best_f = max((p.fwd_gbs for p in peers if p.fwd_gbs), default=None)
        best_b = max((p.bwd_gbs for p in peers if p.bwd_gbs), default=None)
        if best_f and r.fwd_gbs:
            r.fwd_vs_best_baseline = r.fwd_gbs / best_f
        if best_b and r.bwd_gbs:
            r.bwd_vs_best_baseline = r.bwd_gbs / best_b


def _fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def markdown_table(rows: list[KernelRow], copy_gbs: float, header: str) -> str:
    lines = [
        header,
        "",
        f"Copy ceiling (device-to-device, read + write): **{copy_gbs:.0f} GB/s**. Kernel times are CUDA-graph "
        "replays (launch overhead excluded); backward = (forward + backward) - forward.",
        "",
        "| method | dtype | N | rows | causal | fwd ms | fwd GB/s | fwd / copy | fwd vs best(torch, compile) "
        "| bwd ms | bwd GB/s | bwd / copy | bwd vs best(torch, compile) | correct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r.correct else ("**NO**" if r.correct is False else f"error: {r.error}")
        lines.append(
            f"| {r.method} | {r.dtype} | {r.n} | {r.rows} | {'yes' if r.causal else 'no'} | {_fmt(r.fwd_ms, '.4f')} "
            f"| {_fmt(r.fwd_gbs)} | {_fmt(r.fwd_frac_copy, '.2f')} | {_fmt(r.fwd_vs_best_baseline, '.2f')} "
            f"| {_fmt(r.bwd_ms, '.4f')} | {_fmt(r.bwd_gbs)} | {_fmt(r.bwd_frac_copy, '.2f')} "
            f"| {_fmt(r.bwd_vs_best_baseline, '.2f')} | {ok} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[KernelRow], copy_gbs: float, path: Path, dtype: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, title in ((axes[0], "fwd_gbs", "forward"), (axes[1], "bwd_gbs", "backward")):
        for method in dict.fromkeys(r.method for r in rows):
            pts = sorted((r.n, getattr(r, key)) for r in rows
                         if r.method == method and r.dtype == dtype and not r.causal and getattr(r, key))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.axhline(copy_gbs, color="black", linestyle="--", label=f"copy {copy_gbs:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row length N")
        ax.set_title(f"softmax {title}, {dtype}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("effective GB/s")
    axes[1].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_rows_csv(rows: list, path: Path) -> None:
    if not rows:
        return
    dicts = [asdict(r) if hasattr(r, "__dataclass_fields__") else dict(r) for r in rows]
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dicts[0]))
    w.writeheader()
    w.writerows(dicts)
    atomic_write_text(path, buf.getvalue())


@dataclass
class KernelBench:
    copy_gbs: float
    write_gbs: float = 0.0
    rows: list[KernelRow] = field(default_factory=list)
    attention: list[dict] = field(default_factory=list)
    causal_floor_ms: Optional[float] = None


def causal_traffic_ms(shape: tuple, dtype: torch.dtype, device: str, rep_ms: int = 100) -> Optional[float]:
    """The memory floor of a fused causal forward, measured: the fastest of a few Triton kernels that
    move exactly its bytes (read each row's unmasked prefix, write the whole row: the prefix copied,
    zeros after) and compute nothing. None where Triton cannot run."""
    try:
        from kernels.methods import triton_softmax as ts

        if ts.unavailable_reason() or ts.triton is None:
            return None
    except Exception:  # pragma: no cover
        return None
    kernel = _causal_traffic_kernel()
    x = torch.randn(shape, device=device).to(dtype)
    y = torch.empty_like(x)
    tq, n = shape[-2], shape[-1]
    n_rows = x.numel() // n
    block = 1 << max(0, (n - 1).bit_length())
    want = x.masked_fill(~torch.ones(tq, n, dtype=torch.bool, device=device).tril(n - tq), 0)
    best = None
    for rows, warps in ((1, 1), (1, 2), (1, 4), (2, 2), (4, 4)):
        def run():
            kernel[(-(-n_rows // rows),)](x, y, n_rows, n, tq, n - tq, BLOCK_N=block, ROWS=rows, num_warps=warps)
        run()
        if not torch.equal(y, want):
            raise AssertionError("causal traffic kernel wrote the wrong values")
        ms = bench_graph_ms(run, rep_ms)[0] if device == "cuda" else bench_ms(run, rep_ms)
        best = ms if best is None else min(best, ms)
    return best


@functools.cache
def _causal_traffic_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def causal_traffic(X, Y, n_rows, n_cols, tq, diag, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        lim = tl.minimum(tl.maximum((rows % tq) + diag + 1, 0), n_cols)  # as the fused kernels' _row_limit
        ok = rows < n_rows
        ptr = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        x = tl.load(X + ptr, mask=ok[:, None] & (cols[None, :] < lim[:, None]), other=0.0)
        tl.store(Y + ptr, x, mask=ok[:, None] & (cols[None, :] < n_cols))

    return causal_traffic


def run_kernel_bench(
    methods: list[str], sizes: list[int], elements: int, dtype: str, fp32_sizes: list[int],
    attention_shape: Optional[tuple], out: Path, rep_ms: int = 100,
) -> KernelBench:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from harness.env import environment

    env = environment()
    copy_gbs = copy_bandwidth(device, nbytes=min(2**30, 4 * elements * 2) if device == "cuda" else 2**22)
    res = KernelBench(copy_gbs, write_bandwidth(device, nbytes=2**30 if device == "cuda" else 2**22))
    plan = [(DTYPES[dtype], n) for n in sizes] + [(torch.float32, n) for n in fp32_sizes]
    for dt, n in plan:
        shape = (max(1, elements // n), n)
        for m in methods:
            row = measure_method(m, shape, dt, 1.0, False, device, rep_ms)
            res.rows.append(row)
            print(f"  {m:8s} {row.dtype:9s} N={n:<7d} fwd {_fmt(row.fwd_gbs):>6s} GB/s  bwd {_fmt(row.bwd_gbs):>6s} GB/s"
                  f"  {'ok' if row.correct else row.error or 'WRONG'}", flush=True)
    if attention_shape:
        att_rows = []
        for m in methods:
            row = measure_method(m, attention_shape, DTYPES[dtype], 0.125, True, device, rep_ms)
            att_rows.append(row)
            print(f"  {m:8s} causal {attention_shape}: fwd {_fmt(row.fwd_ms, '.4f')} ms bwd {_fmt(row.bwd_ms, '.4f')} ms",
                  flush=True)
        res.causal_floor_ms = causal_traffic_ms(attention_shape, DTYPES[dtype], device, rep_ms)
        print(f"  memory floor of the causal forward (same bytes, no math): {_fmt(res.causal_floor_ms, '.4f')} ms",
              flush=True)
        comp = next((r for r in att_rows if r.method == "compile" and r.correct), None)
        for r in att_rows:
            res.attention.append({
                **asdict(r),
                "fwd_vs_compile_time": (r.fwd_ms / comp.fwd_ms) if comp and r.fwd_ms and r.correct else None,
                "bwd_vs_compile_time": (r.bwd_ms / comp.bwd_ms) if comp and r.bwd_ms and r.correct else None,
            })
    fill_ratios(res.rows, copy_gbs)
    out.mkdir(parents=True, exist_ok=True)
    header = (f"## Softmax kernels on {env['device_name']} (torch {env['torch']}, triton {env['triton']}, "
              f"CUDA {env['cuda']}), rows x N = {elements} elements")
    md = markdown_table(res.rows, copy_gbs, header)
    md += f"\nWrite-only ceiling (fill): {res.write_gbs:.0f} GB/s.\n"
    if res.attention:
        md += (f"\n### Attention-shaped causal scores {tuple(attention_shape)}, {dtype}, scale 1/8\n\n"
               "| method | fwd ms | fwd time / compile | bwd ms | bwd time / compile | correct |\n|---|---|---|---|---|---|\n")
        for a in res.attention:
            md += (f"| {a['method']} | {_fmt(a['fwd_ms'], '.4f')} | {_fmt(a['fwd_vs_compile_time'], '.2f')} "
                   f"| {_fmt(a['bwd_ms'], '.4f')} | {_fmt(a['bwd_vs_compile_time'], '.2f')} | "
                   f"{'yes' if a['correct'] else 'NO ' + a['error']} |\n")
        comp_ms = next((a["fwd_ms"] for a in res.attention if a["method"] == "compile" and a["correct"]), None)
        if res.causal_floor_ms:
            md += (f"| memory floor (forward bytes, no math) | {res.causal_floor_ms:.4f} | "
                   f"{_fmt(res.causal_floor_ms / comp_ms if comp_ms else None, '.2f')} | | | |\n")
    atomic_write_text(out / "kernels.md", md)
    write_rows_csv(res.rows, out / "kernels.csv")
    write_json(out / "kernels.json", {"env": env, "copy_gbs": copy_gbs, "write_gbs": res.write_gbs, "rows": [asdict(r) for r in res.rows],
                                      "attention": res.attention, "causal_floor_ms": res.causal_floor_ms})
    plot(res.rows, copy_gbs, out / "kernels.png", str(DTYPES[dtype]).replace("torch.", ""))
    print(md)
    return res


# ------------------------------------------------------------------------------------------------
# overhead: harness vs a bare loop
# ------------------------------------------------------------------------------------------------
def bare_loop_tokens_per_s(cfg, steps: int, warmup: int) -> float:
    """Train the same model the same way as the harness does, with nothing around it."""
    from harness.build import build_model, accel_applied, seq_len
    from harness.data import BatchStream, make_corpus
    from harness.task import make_optimizer, warmup_cosine_lr

    torch.manual_seed(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = seq_len(cfg)
    model = build_model(cfg).to(device)
    vocab = model.config.vocab_size
    accel_applied(model, cfg)
    opt = make_optimizer(model, cfg.trainer.lr, cfg.trainer.weight_decay, (cfg.trainer.beta1, cfg.trainer.beta2))
    corpus = make_corpus(cfg.data, seq)
    total = steps + warmup
    stream = BatchStream(None if corpus is None else corpus.train, vocab, cfg.data.batch_size, seq,
                         cfg.seed, "train", 0, total)
    amp = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    t0 = None
    for i, (x, y) in enumerate(stream):
        for group in opt.param_groups:  # as LanguageModelTask.on_train_batch_start does
            group["lr"] = warmup_cosine_lr(i, cfg.trainer.lr, cfg.trainer.lr_warmup_steps, total,
                                           cfg.trainer.min_lr_ratio)
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        if device == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        with amp:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * cfg.data.batch_size * seq / (time.perf_counter() - t0)


def run_overhead(overrides: list[str], steps: int, rounds: int, out: Path) -> dict:
    from hydra import compose, initialize_config_dir

    from harness.env import environment
    from harness.config import CONF_DIR
    from harness.train import run_training

    warmup = 5
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "accel=torch", "data=synthetic", "logger=none", f"trainer.max_steps={steps + warmup}",
            f"trainer.warmup_steps={warmup}", "trainer.window=10", "trainer.val_every=0", "trainer.val_batches=1",
            *overrides,
        ])
    harness_tps, bare_tps = [], []
    for r in range(rounds):
        res = run_training(cfg, out / f"harness_round{r}")
        harness_tps.append(res["tokens_per_s"])
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        bare_tps.append(bare_loop_tokens_per_s(cfg, steps, warmup))
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        print(f"round {r}: harness {harness_tps[-1]:,.0f} tokens/s, bare loop {bare_tps[-1]:,.0f} tokens/s", flush=True)
    h, b = statistics.median(harness_tps), statistics.median(bare_tps)
    result = {"env": environment(), "model": cfg.model.name, "accel": cfg.accel.name, "steps": steps,
              "rounds": rounds, "harness_tokens_per_s": harness_tps, "bare_tokens_per_s": bare_tps,
              "harness_median": h, "bare_median": b, "ratio": h / b}
    write_json(out / "overhead.json", result)
    print(f"harness / bare loop = {h / b:.3f} (harness {h:,.0f}, bare {b:,.0f} tokens/s; median of {rounds})")
    return result


# ------------------------------------------------------------------------------------------------
# triton launch-settings sweep (how the heuristics in kernels/methods/triton_softmax.py were chosen)
# ------------------------------------------------------------------------------------------------
def triton_candidates(n: int, causal: bool = False) -> list:
    from kernels.methods import triton_softmax as ts
    from kernels.methods.triton_softmax import Plan, _next_pow2

    block = _next_pow2(n)
    plans = []
    if block <= 32768:
        # causal rows: small programs won before (uneven work per row), so only those, in more variants
        tiles = (1024, 2048, 4096) if causal else (4096, 8192, 16384)
        for tile in sorted({max(block, t) for t in tiles}):
            rows = tile // block
            if rows < 1 or rows > 64:
                continue
            for warps in ((1, 2, 4, 8, 16, 32) if causal else (4, 8, 16, 32)):
                per_thread = tile // (32 * warps)
                if 8 <= per_thread <= (64 if causal else 32):
                    plans.append(Plan(False, block, rows, warps))
                    if causal:  # the tile kernel's exact-prefix loads as well as whole-vector ones (the
                        # backward; the forward's fallback for scales the fill cannot take), and the fill kernel
                        plans.append(Plan(False, block, rows, warps, round_mask=False))
                        plans.append(Plan(False, block, rows, warps, fill=True))
    if block >= 8192:
        for chunk in (4096, 8192):
            for warps in (8, 16):
                if 4 <= chunk // (32 * warps) <= 32:
                    plans.append(Plan(True, chunk, 1, warps))
    if not causal and 16384 <= block <= 65536:  # persistent tile path, rows pipelined through shared memory
        for warps in (16, 32):
            if 16 <= block // (32 * warps) <= 64:
                for stages in (2, 3):
                    plans.append(Plan(False, block, 1, warps, stages=stages))
                plans.append(Plan(False, block, 1, warps, stages=2, programs_per_sm=2))
    if not causal and ts.MAX_TILE_N < n <= ts.RING_MAX_N:  # ring path (backward; Gluon, 16-bit rows, GPU)
        for warps, slots in ((16, 24), (32, 12), (32, 13)):
            plans.append(Plan(False, block, 1, warps, ring=True, slots=slots))
    if not causal and ts.HYBRID_MIN_N < n <= ts.RING_MAX_N:  # hybrid path (forward; Gluon, 16-bit rows, GPU)
        for warps in (8, ts.HYBRID_WARPS):
            plans.append(Plan(False, block, 1, warps, hybrid=True))
    if block >= 8192:
        for chunk in (4096, 8192, 16384):  # split path: a row over -(-n // chunk) programs
            for warps in (4, 8, 16):
                if chunk < n and -(-n // chunk) <= ts.MAX_SPLITS and 8 <= chunk // (32 * warps) <= 32:
                    plans.append(Plan(False, chunk, 1, warps, split=True))
    return plans


def run_triton_sweep(sizes: list[int], elements: int, dtype: str, out: Path, causal_shapes: list[tuple],
                     match: str = "") -> list[dict]:
    from kernels.methods import triton_softmax as ts

    dt = DTYPES[dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: Triton's interpreter, for tests
    cases = [((max(1, elements // n), n), False) for n in sizes] + [(shape, True) for shape in causal_shapes]
    results = []
    for shape, causal in cases:
        n = shape[-1]
        x = torch.randn(shape, device=device, dtype=torch.float32).mul_(2).to(dt)
        ref, y, dy, dref = sweep_references(x, causal)
        nbytes = x.numel() * x.element_size()
        default = ts.plan(n, x.element_size(), causal=causal)
        mine = []
        for p in triton_candidates(n, causal):
            if match not in str(p):
                continue
            row = {"n": n, "causal": causal, "plan": str(p), "default": p == default}
            for d, run, want, tol, moved in (
                ("fwd", lambda: ts.launch_fwd(x, 1.0, causal, p), ref, kernels.FWD_TOL[dt], 2 * nbytes),
                ("bwd", lambda: ts.launch_bwd(y, dy, 1.0, causal, p), dref, kernels.BWD_TOL[dt], 3 * nbytes),
            ):  # each direction on its own: a candidate may fit one (e.g. shared memory) and not the other
                try:
                    row[f"{d}_ok"] = error_on_device(run(), want) <= tol
                    row[f"{d}_gbs"] = moved / (bench_graph_ms(run, 50)[0] * 1e-3) / 1e9
                except Exception as exc:
                    row[f"{d}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            mine.append(row)
        results += mine
        best_f = max((r for r in mine if r.get("fwd_ok") and "fwd_gbs" in r), key=lambda r: r["fwd_gbs"], default=None)
        best_b = max((r for r in mine if r.get("bwd_ok") and "bwd_gbs" in r), key=lambda r: r["bwd_gbs"], default=None)
        dflt = next((r for r in mine if r["default"]), {})
        print(f"N={n:<7d}{' causal' if causal else '       '} fwd best {best_f and best_f['plan']} "
              f"{best_f and round(best_f['fwd_gbs'])} GB/s (default {round(dflt.get('fwd_gbs', 0))}) | bwd best "
              f"{best_b and best_b['plan']} {best_b and round(best_b['bwd_gbs'])} GB/s (default "
              f"{round(dflt.get('bwd_gbs', 0))})", flush=True)
        del x, dy, y, ref, dref
        if device == "cuda":
            torch.cuda.empty_cache()
    write_json(out / "triton_sweep.json", {"rows": results})
    return results


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels", help="softmax GB/s vs N per method, with the copy ceiling")
    k.add_argument("--methods", default="triton,cuda,torch,compile",
                   help="comma-separated kernels methods (default: %(default)s; naive is slow, add it if wanted)")
    k.add_argument("--sizes", default=DEFAULT_SIZES, help="row lengths N (default: %(default)s)")
    k.add_argument("--elements", type=int, default=2**27, help="rows x N per measurement (default: 2^27)")
    k.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    k.add_argument("--fp32-sizes", default="1024,16384", help="extra fp32 row lengths ('' for none)")
    k.add_argument("--attention", default="8,12,1024,1024",
                   help="B,H,T,T of the causal attention-shaped case ('' to skip)")
    k.add_argument("--rep-ms", type=int, default=100)
    k.add_argument("--out", default="outputs/bench", type=Path)
    o = sub.add_parser("overhead", help="harness tokens/s vs a bare PyTorch loop (torch method)")
    o.add_argument("overrides", nargs="*", default=["model=gpt2s"], help="Hydra overrides (default: model=gpt2s)")
    o.add_argument("--steps", type=int, default=30)
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--out", default="outputs/bench", type=Path)
    t = sub.add_parser("triton-sweep", help="time candidate Triton launch settings per N (GPU only)")
    t.add_argument("--sizes", default=DEFAULT_SIZES)
    t.add_argument("--elements", type=int, default=2**27)
    t.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    t.add_argument("--causal", default="8,12,1024,1024",
                   help="causal cases B,H,T,T, several separated by ';' ('' to skip)")
    t.add_argument("--match", default="", help="only the candidates whose plan text holds this, e.g. 'fill=True'")
    t.add_argument("--out", default="outputs/bench", type=Path)
    c = sub.add_parser("cuda-sweep", help="time the CUDA kernels' launch variants per N (GPU + nvcc only)")
    c.add_argument("--sizes", default=DEFAULT_SIZES)
    c.add_argument("--elements", type=int, default=2**27)
    c.add_argument("--out", default="outputs/bench", type=Path)
    a = p.parse_args(argv)
    ints = lambda s: [int(v) for v in s.split(",") if v.strip()]  # noqa: E731
    if a.cmd == "triton-sweep":
        a.out.mkdir(parents=True, exist_ok=True)
        causal = [tuple(ints(c)) for c in a.causal.split(";") if c.strip()]
        if any(len(c) < 2 for c in causal):
            p.error(f"--causal takes shapes like 8,12,1024,1024 separated by ';' (got {a.causal!r})")
        run_triton_sweep(ints(a.sizes), a.elements, a.dtype, a.out, causal, a.match)
        return
    if a.cmd == "cuda-sweep":
        from kernels.methods.cuda.sweep import run_cuda_sweep

        a.out.mkdir(parents=True, exist_ok=True)
        run_cuda_sweep(ints(a.sizes), a.elements, a.out)
        return
    if a.cmd == "kernels":
        methods = [m.strip() for m in a.methods.split(",") if m.strip()]
        runnable = kernels.runnable_methods()
        skipped = [m for m in methods if m not in runnable]
        if skipped:
            reasons = kernels.available_methods()
            for m in skipped:
                why = reasons[m].reason if m in reasons else "unknown method"
                print(f"skipping {m}: {why}")
        att = tuple(ints(a.attention)) if a.attention else None
        run_kernel_bench([m for m in methods if m in runnable], ints(a.sizes), a.elements, a.dtype,
                         ints(a.fp32_sizes), att, a.out, a.rep_ms)
    else:
        run_overhead(a.overrides, a.steps, a.rounds, a.out)


if __name__ == "__main__":
    main()
