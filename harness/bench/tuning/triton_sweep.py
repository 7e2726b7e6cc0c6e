"""The launch-table sweep of the ``triton`` softmax: times candidate launch settings per row length N, each
checked forward and backward against float64 first (how the tables in
``kernels/methods/triton/softmax/plan.py`` were chosen; the measurements are in docs/perf.md). GPU only for
meaningful numbers (on a CPU it runs in Triton's interpreter, for tests). Run as ``python -m harness.bench
triton-sweep``; writes ``triton_sweep.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

import kernels
from harness.bench.common import DTYPES, parse_ints
from harness.bench.timing import bench_graph_ms, error_on_device, sweep_references
from kernels.methods.triton.softmax import plan as tp
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.methods.triton.softmax.plan import Plan, _next_pow2

DEFAULT_SIZES = "128,256,512,1024,2048,4096,8192,16384,32768,65536,262144"


def triton_candidates(n: int, causal: bool = False) -> list:
    """The plans the sweep times for rows of n columns (causal: the causal rows' candidates)."""
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
                    if per_thread >= 16:  # (backward) rows re-read for dx, or held 16-bit: fewer registers
                        plans.append(Plan(False, block, rows, warps, reload=True))
                        plans.append(Plan(False, block, rows, warps, narrow=True))
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
                    plans.append(Plan(False, block, 1, warps, stages=stages, narrow=True))  # (backward only)
                plans.append(Plan(False, block, 1, warps, stages=2, programs_per_sm=2))
    if not causal and tp.MAX_TILE_N < n <= tp.RING_MAX_N:  # ring path (backward; Gluon, 16-bit rows, GPU)
        for warps, slots in ((16, 24), (32, 12), (32, 13)):
            plans.append(Plan(False, block, 1, warps, ring=True, slots=slots))
    if not causal and tp.HYBRID_MIN_N < n <= tp.RING_MAX_N:  # hybrid path (forward; Gluon, 16-bit rows, GPU)
        for warps in (8, tp.HYBRID_WARPS):
            plans.append(Plan(False, block, 1, warps, hybrid=True))
    if block >= 8192:
        for chunk in (4096, 8192, 16384):  # split path: a row over -(-n // chunk) programs
            for warps in (4, 8, 16):
                if chunk < n and -(-n // chunk) <= tp.MAX_SPLITS and 8 <= chunk // (32 * warps) <= 32:
                    plans.append(Plan(False, chunk, 1, warps, split=True))
    return plans


def run_triton_sweep(sizes: list[int], elements: int, dtype: str, out: Path, causal_shapes: list[tuple],
                     match: str = "") -> list[dict]:
    dt = DTYPES[dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: Triton's interpreter, for tests
    cases = [((max(1, elements // n), n), False) for n in sizes] + [(shape, True) for shape in causal_shapes]
    results = []
    for shape, causal in cases:
        n = shape[-1]
        x = torch.randn(shape, device=device, dtype=torch.float32).mul_(2).to(dt)
        ref, y, dy, dref = sweep_references(x, causal)
        nbytes = x.numel() * x.element_size()
        default = tp.plan(n, x.element_size(), causal=causal)
        mine = []
        for p in triton_candidates(n, causal):
            if match not in str(p):
                continue
            row = {"n": n, "causal": causal, "plan": str(p), "default": p == default}
            for d, run, want, tol, moved in (
                ("fwd", lambda: launch_fwd(x, 1.0, causal, p), ref, kernels.FWD_TOL[dt], 2 * nbytes),
                ("bwd", lambda: launch_bwd(y, dy, 1.0, causal, p), dref, kernels.BWD_TOL[dt], 3 * nbytes),
            ):  # each direction on its own: a candidate may fit one (e.g. shared memory) and not the other
                if d == "fwd" and (p.reload or p.narrow):  # (backward-only switches: the forward would time its twin again)
                    continue
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
    (out / "triton_sweep.json").write_text(json.dumps({"rows": results}, indent=2) + "\n")
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's command-line arguments (``python -m harness.bench triton-sweep``)."""
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--elements", type=int, default=2**27)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--causal", default="8,12,1024,1024",
                   help="causal cases B,H,T,T, several separated by ';' ('' to skip)")
    p.add_argument("--match", default="", help="only the candidates whose plan text holds this, e.g. 'fill=True'")
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[dict]:
    """Run the sweep that parsed arguments ask for; error (the parser's) reports a malformed --causal."""
    a.out.mkdir(parents=True, exist_ok=True)
    causal = [tuple(parse_ints(c)) for c in a.causal.split(";") if c.strip()]
    if any(len(c) < 2 for c in causal):
        error(f"--causal takes shapes like 8,12,1024,1024 separated by ';' (got {a.causal!r})")
    return run_triton_sweep(parse_ints(a.sizes), a.elements, a.dtype, a.out, causal, a.match)

