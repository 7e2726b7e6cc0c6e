"""The cross-entropy launch sweep of the `triton` method: how the plan in
``kernels/methods/triton/cross_entropy/launch.py`` (``plan``) is chosen (GPU only)::

    python -m harness.bench triton-ce-sweep [--sizes 32768,50304,128256,262144] [--rows 16384]
        [--max-gb 4] [--rep-ms 50] [--out outputs/bench]

Per vocabulary size V, on rows x V bf16 logits (fewer rows for large V, so that the logits and the
gradient stay within ``--max-gb``), targets in range with 1% ignored, reduction 'mean': every candidate
plan (hybrid: 16 and 8 warps, where it can take the rows; slices, past 65536 columns: 8 and 16 warps x
the fewest slices, one more and twice as many, where they can take the rows; split: chunk length x
warps; stream: chunk length x warps; tile where the row fits) runs the eager forward with gradient
(``launch.forward``: the target count, the one pass that writes the loss rows and the
gradient), is checked against float64 (the per-row losses and the
gradient, ``cuda_ce_sweep.check``), then timed by CUDA-graph replay (the GPU time)
and eagerly (host cost included). GB/s count the one-read-one-write ideal, 2 x the logits' bytes, also
as a fraction of the copy ceiling of the same run. Writes ``triton_ce_sweep.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

from harness.bench.common import parse_ints
from harness.bench.timing import bench_graph_ms, bench_ms, copy_bandwidth
from harness.bench.tuning.cuda_ce_sweep import add_vocabulary_arguments, ce_inputs, check, reference_loss
from kernels.methods.triton.cross_entropy import launch as ck

IGNORE = -100


def candidates(v: int, usable: Callable[[ck.Plan], bool] = lambda p: False) -> list[ck.Plan]:
    """Candidate plans for rows of v columns: the current plan first (``current_plan``), then the hybrid
    path (8 and 16 warps, in its range where ``usable`` says it can take the sweep's rows), the slices
    path (longer rows: 8 and 16 warps x the fewest slices of at most 65536 columns, one more (at 8 warps
    two programs then share an SM) and twice as many, where the row can be cut so and ``usable`` says
    they can take the sweep's rows), the split and stream grids."""
    out = [current_plan(v, usable)]
    if ck._next_pow2(v) <= ck.TILE_MAX_N:
        return out
    if ck.HYBRID_MIN_N < v <= ck.HYBRID_MAX_N:
        out += [p for p in (ck.Plan("hybrid", ck._next_pow2(v), 1, w) for w in (16, 8)) if usable(p)]
    if v > ck.HYBRID_MAX_N:
        s0 = ck.default_slices(v)
        plans = (ck.slices_plan(v, s, w) for s in dict.fromkeys((s0, s0 + 1, 2 * s0)) for w in (8, 16))
        out += [p for p in plans if p is not None and usable(p)]
    for block in (2048, 4096, 8192, 16384):
        if -(-v // block) <= ck.MAX_SPLITS:
            out += [ck.Plan("split", block, 1, w) for w in (4, 8, 16) if block // (32 * w) >= 4]
    for block in (1024, 2048, 4096, 8192):
        out += [ck.Plan("stream", block, 1, w) for w in (4, 8, 16) if block // (32 * w) >= 4]
    return list(dict.fromkeys(out))


def current_plan(v: int, usable: Callable[[ck.Plan], bool] = lambda p: False) -> ck.Plan:
    """The plan ``launch_ce`` takes for the sweep's rows of v columns (a hybrid or slices plan only where
    usable)."""
    p = ck.plan(v)
    return p if p.path not in ("hybrid", "slices") or usable(p) else ck.plan(v, hybrid=False)


def run_sweep(sizes: list[int], rows: int, max_gb: float, rep_ms: int, out: Path) -> list[dict]:
    copy_gbs = copy_bandwidth("cuda")
    print(f"triton-ce-sweep: copy {copy_gbs:.0f} GB/s; {torch.cuda.get_device_name()}", flush=True)
    results = []
    for v in sizes:
        n = max(1, min(rows, int(max_gb * 1e9 / (2 * 2 * v))))
        x, t, inv = ce_inputs(n, v)
        chk = min(n, 512)
        ref = reference_loss(x[:chk], t[:chk], 128)
        moved = 2 * x.numel() * x.element_size()
        head = None
        usable = lambda p: ck.unusable(x, x, p) is None  # noqa: E731
        current = current_plan(v, usable)
        for p in candidates(v, usable):
            row = {"v": v, "rows": n, "path": p.path, "block_n": p.block_n, "tile_rows": p.rows, "warps": p.num_warps,
                   "slices": p.slices, "current": p == current}
            try:
                run = lambda p=p: ck.forward(x, t, IGNORE, "mean", True, p=p)  # noqa: E731
                loss, count, grad = run()
                inv_c = (1.0 / count.clamp(min=1.0)).reshape(())
                row["loss_err"], row["grad_err"] = check(loss[:chk], grad[:chk], x[:chk], t[:chk], inv_c, ref, 128)
                row["ok"] = row["loss_err"] <= 1e-4 and row["grad_err"] <= 1e-2
                del loss, grad
                if row["ok"]:
                    graph_ms, _ = bench_graph_ms(run, rep_ms)
                    eager_ms = bench_ms(run, rep_ms)
                    row.update(graph_ms=graph_ms, eager_ms=eager_ms, of_copy=moved / (graph_ms * 1e-3) / 1e9 / copy_gbs,
                               eager_of_copy=moved / (eager_ms * 1e-3) / 1e9 / copy_gbs)
            except Exception as exc:  # a candidate that cannot launch here
                row["ok"], row["error"] = False, f"{type(exc).__name__}: {str(exc)[:200]}"
            results.append(row)
            desc = (f"{p.path} {p.block_n}x{p.num_warps}w" + (f" {p.slices}s" if p.slices else "")
                    + (" (current)" if row["current"] else ""))
            if row.get("graph_ms"):
                print(f"  V={v:<7d} {desc:<26s} graph {row['graph_ms']:.3f} ms ({row['of_copy']:.2f} of copy), "
                      f"eager {row['eager_ms']:.3f} ms", flush=True)
            else:
                print(f"  V={v:<7d} {desc:<26s} WRONG/FAILED {row.get('error') or row}", flush=True)
            torch.cuda.empty_cache()
        best = max((r for r in results if r["v"] == v and r.get("graph_ms")), key=lambda r: r["of_copy"], default=None)
        if best:
            print(f"V={v} best: {best['path']} {best['block_n']}x{best['warps']}w"
                  f"{' %ds' % best['slices'] if best['slices'] else ''} {best['graph_ms']:.3f} ms "
                  f"({best['of_copy']:.2f} of copy)", flush=True)
        del x, t, inv
        torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "triton_ce_sweep.json").write_text(json.dumps({"copy_gbs": copy_gbs, "results": results}, indent=1))
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_vocabulary_arguments(p)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[dict]:
    if not torch.cuda.is_available():
        error("the sweep times kernels on a CUDA GPU; none was found")
    return run_sweep(parse_ints(a.sizes), a.rows, a.max_gb, a.rep_ms, a.out)
