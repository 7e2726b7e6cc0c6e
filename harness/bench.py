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
import gc
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import kernels
from harness.results import atomic_write_text, write_json
from kernels.timing import bench_graph_ms, copy_bandwidth, error_on_device, sweep_references, write_bandwidth

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
        from kernels.methods.triton.traffic import causal_traffic_ms

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
    from harness.data import BatchStream, make_corpus
    from harness.methods import apply_accel
    from harness.task import make_optimizer, warmup_cosine_lr
    from harness.train import build_model

    torch.manual_seed(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = int(cfg.data.seq_len or cfg.model.context)
    model = build_model(cfg).to(device)
    vocab = model.config.vocab_size
    apply_accel(model, cfg.accel.attention, cfg.accel.softmax)
    opt = make_optimizer(model, cfg.trainer.lr, cfg.trainer.weight_decay, (cfg.trainer.beta1, cfg.trainer.beta2))
    corpus = make_corpus(cfg.data, seq)
    total = steps + warmup
    stream = BatchStream(None if corpus is None else corpus.train, vocab, cfg.model.batch_size, seq,
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
    return steps * cfg.model.batch_size * seq / (time.perf_counter() - t0)


def run_overhead(overrides: list[str], steps: int, rounds: int, out: Path) -> dict:
    from hydra import compose, initialize_config_dir

    from harness.env import environment
    from harness.train import CONF_DIR, run_training

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
# cuda launch-variant sweep (how the launch table in csrc/softmax_kernels.cu was chosen)
# ------------------------------------------------------------------------------------------------
_CUDA_PATHS = {"register": 0, "cluster": 1, "split": 2, "persist": 3, "hybrid": 4}


def cuda_variants(n: int, rows: int = 1) -> list[dict]:
    """Candidate launches for rows of n bf16 columns: path, elements per thread, threads per CTA (cluster
    and split paths), and per direction: forward `merged` (one merged (max, sum) reduction instead of
    two; the split path always merges) and `packed` (the row kept as loaded, exponentials computed
    twice), backward `cap` (registers capped for more blocks per SM)."""
    block = 1 << max(0, (n - 1).bit_length())
    shapes = []
    if block <= 32768:
        shapes += [{"path": "register", "items": i, "threads": 0} for i in (8, 16, 32, 64)
                   if block // i <= 1024 and i <= block]
    if n >= 8192:  # a row over a thread-block cluster, 2-16 CTAs holding a slice each in registers
        shapes += [{"path": "cluster", "items": i, "threads": t} for t in (256, 512) for i in (32, 64)
                   if 2 <= -(-n // (t * i)) <= 16]
    if n >= 4096:
        shapes += [{"path": "split", "items": i, "threads": t} for t in (256, 512) for i in (8, 16, 32, 64)
                   if 2 <= -(-n // (t * i)) <= 128 and rows * -(-n // (t * i)) < 2**31]
    shapes = [{**sh, "buffers": 0, "ctas": 1} for sh in shapes]
    def smem_fits(sh: dict, tensors: int) -> bool:  # row buffers of t x i bf16 per tensor in 227 KB (H100/H200)
        return tensors * sh["buffers"] * sh["threads"] * sh["items"] * 2 <= 227 * 1024

    persist = [{"path": "persist", "items": i, "threads": t, "buffers": b, "ctas": c}
               for c in (1, 2, 4, 8) for t in (512, 1024) for i in (16, 32, 64) for b in (1, 2, 3)
               if c * t * i // 2 < n <= c * t * i and (c <= 2 or i <= 32)]
    persist = [sh for sh in persist if smem_fits(sh, 1)]
    fwd = [{**sh, "dir": "fwd", "merged": m, "packed": p} for sh in shapes for m in (False, True) for p in (False, True)
           if m or sh["path"] not in ("split", "cluster")]  # (one merged exchange over CTAs)
    # persistent forward: clusters merge (max, sum); packed rows only merged; 64 elements only packed
    fwd += [{**sh, "dir": "fwd", "merged": m, "packed": p} for sh in persist
            for m, p in ((False, False), (True, False), (True, True))
            if (m or sh["ctas"] == 1) and (p or sh["items"] <= 32)]
    # hybrid forward (16-bit rows of 32769-65536 columns): a block per row, `items` elements per thread
    # in registers (packed, merged) and the rest of the row in shared memory, two blocks per SM
    fwd += [{"path": "hybrid", "items": i, "threads": t, "buffers": 0, "ctas": 1, "dir": "fwd", "merged": True,
             "packed": True} for t, i in ((512, 64), (512, 32), (256, 64)) if 32768 < n <= 65536 and t * i < n]
    bwd = [{**sh, "dir": "bwd", "cap": c} for sh in shapes for c in (False, True)]
    bwd += [{**sh, "dir": "bwd", "cap": False} for sh in persist if sh["items"] <= 32 and smem_fits(sh, 2)]
    return fwd + bwd


def load_cuda_tuning() -> float:
    """Build (or load) the extension of launch variants (csrc/softmax_tuning*.{cu,cpp}); returns seconds."""
    from torch.utils.cpp_extension import load

    from kernels.methods.cuda_softmax import CSRC, headers_flag

    t0 = time.perf_counter()
    load(name="softmax_harness_cuda_tuning",
         sources=[str(CSRC / "softmax_tuning_binding.cpp"), str(CSRC / "softmax_tuning.cu"),
                  str(CSRC / "softmax_tuning_persist.cu")],
         extra_cflags=["-O3"], extra_include_paths=[str(CSRC)],
         extra_cuda_cflags=["-O3", headers_flag([CSRC / "softmax_device.cuh", CSRC / "softmax_tuning.h"])],
         is_python_module=False, verbose=False)
    return time.perf_counter() - t0


def run_cuda_sweep(sizes: list[int], elements: int, out: Path, rep_ms: int = 50) -> list[dict]:
    build_s = load_cuda_tuning()
    ops = torch.ops.softmax_harness_cuda_tuning
    copy_gbs = copy_bandwidth("cuda")
    print(f"cuda-sweep: variants built in {build_s:.1f} s; copy {copy_gbs:.0f} GB/s", flush=True)
    results = []
    for n in sizes:
        x = torch.randn((max(1, elements // n), n), device="cuda").mul_(2).to(torch.bfloat16)
        ref, y, dy, dref = sweep_references(x, causal=False)
        nbytes = x.numel() * x.element_size()
        for v in cuda_variants(n, x.shape[0]):
            row = {"n": n, **v}
            path = _CUDA_PATHS[v["path"]]
            if v["dir"] == "fwd":
                run = lambda: ops.fwd_variant(x, v["items"], v["merged"], v["packed"], path, v["threads"], v["buffers"],
                                                v["ctas"])  # noqa: E731
                want, tol, moved = ref, kernels.FWD_TOL[torch.bfloat16], 2 * nbytes
            else:
                run = lambda: ops.bwd_variant(y, dy, v["items"], v["cap"], path, v["threads"], v["buffers"], v["ctas"])  # noqa: E731
                want, tol, moved = dref, kernels.BWD_TOL[torch.bfloat16], 3 * nbytes
            try:
                got = run()
                if got.numel() == 0:
                    continue
                row["ok"] = error_on_device(got, want) <= tol
                ms, _ = bench_graph_ms(run, rep_ms)
                row["gbs"] = moved / (ms * 1e-3) / 1e9
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            results.append(row)
        mine = [r for r in results if r["n"] == n]

        def best(direction):
            r = max((r for r in mine if r["dir"] == direction and r.get("ok")), key=lambda r: r["gbs"], default=None)
            if r is None:
                return "none correct"
            flag = "".join(f" {k}" for k in ("merged", "packed", "cap") if r.get(k))
            flag += f" buffers={r['buffers']}" if r.get("buffers") else ""
            flag += f" ctas={r['ctas']}" if r.get("ctas", 1) > 1 else ""
            return (f"{r['path']} threads={r['threads']} items={r['items']}{flag} {r['gbs']:.0f} GB/s "
                    f"({r['gbs'] / copy_gbs:.2f} of copy)")

        bad = sum(1 for r in mine if r.get("error") or r.get("ok") is False)
        print(f"N={n:<7d} fwd best {best('fwd')} | bwd best {best('bwd')} | {bad} wrong/failed", flush=True)
        del x, y, dy, ref, dref
        torch.cuda.empty_cache()
    write_json(out / "cuda_sweep.json", {"copy_gbs": copy_gbs, "build_s": build_s, "rows": results})
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
    from kernels.methods.triton import sweep as triton_sweep  # (also python -m kernels.methods.triton.sweep)

    triton_sweep.add_arguments(sub.add_parser("triton-sweep", help="time candidate Triton launch settings per N (GPU only)"))
    c = sub.add_parser("cuda-sweep", help="time the CUDA kernels' launch variants per N (GPU + nvcc only)")
    c.add_argument("--sizes", default=DEFAULT_SIZES)
    c.add_argument("--elements", type=int, default=2**27)
    c.add_argument("--out", default="outputs/bench", type=Path)
    a = p.parse_args(argv)
    ints = lambda s: [int(v) for v in s.split(",") if v.strip()]  # noqa: E731
    if a.cmd == "triton-sweep":
        triton_sweep.run_from_args(a, p.error)
        return
    if a.cmd == "cuda-sweep":
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
