"""The cross-entropy launch sweep of the `cuda` method: how the launch table in
``csrc/cross_entropy_kernels.cu`` is chosen (GPU and nvcc only)::

    python -m harness.bench cuda-ce-sweep [--sizes 32768,50304,128256,262144] [--rows 16384]
        [--max-gb 4] [--rep-ms 50] [--match TEXT] [--out outputs/bench]

Builds the variants in ``csrc/cross_entropy_tuning*.cu`` as their own extension (bf16, dense rows; see
``csrc/cross_entropy_tuning.h``). Per vocabulary size V, on rows x V bf16 logits (``--rows``, fewer for
large V so that the logits and the gradient stay within ``--max-gb``), targets in range with 1% ignored,
the gradient scaled by 1 / n_valid (a mean): every candidate launch is first checked against float64 (the
per-row losses, and the gradient (softmax - onehot) / n_valid), then timed with
``harness.bench.timing.bench_graph_ms`` (CUDA-graph replay: the GPU time) and ``bench_ms`` (eager launches, host
cost included). GB/s count the one-read-one-write ideal, 2 x the logits' bytes, and are also given as a
fraction of the copy ceiling measured in the same run (``harness.bench.timing.copy_bandwidth``). Also timed:
the production table (``ce_rows`` as shipped, and with each path forced), the whole op
(``kernels.cross_entropy(method="cuda")``, forward + backward), ``scale_grad_`` at g = 1 (a launch) and
g = 0.5 (a pass), and ``F.cross_entropy`` forward + backward on the same bf16 logits, for scale.
Writes ``ce_sweep.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import kernels
from harness.bench.common import parse_ints
from harness.bench.timing import bench_graph_ms, bench_ms, copy_bandwidth
from kernels.methods.cuda import ce_code_path, prepare
from harness.bench.tuning.cuda_sweep import load_tuning
from kernels.methods.cuda.build import CE_DEVICE_HEADERS, CSRC, DEVICE_HEADERS
from kernels.reference import FWD_TOL

_PATHS = {"register": 0, "hybrid": 1, "split": 2, "stream": 3}
# compiled in csrc/cross_entropy_tuning_split.cu: (threads, register items, shared items)
HYBRID = [(512, 64, 32), (512, 64, 40), (512, 64, 48), (512, 64, 64), (512, 32, 64), (512, 32, 96), (256, 64, 128),
          (1024, 32, 32)]
# (threads, register items, shared items, packed)
SPLIT = [(256, 32, 0, True), (256, 64, 0, True), (512, 32, 0, True), (512, 64, 0, True), (1024, 32, 0, True),
         (256, 32, 0, False), (512, 16, 0, False), (512, 64, 32, True), (512, 64, 64, True)]
MAX_SPLITS = 128
IGNORE = -100


def ce_variants(v: int, rows: int, sms: int) -> list[dict]:
    """The candidate launches for rows of v bf16 columns (those compiled in the tuning extension)."""
    out = []
    bn = 1 << max(12, (v - 1).bit_length())
    if bn <= 65536:
        for items in (16, 32, 64):
            for packed in (False, True):
                threads = bn // items
                need = (items // 8 * 4 + 28) if packed else (items + 36)  # ce_reg_cap in csrc/cross_entropy/rows.cuh
                cap = 32 if need <= 32 else 64 if need <= 64 else 80 if need <= 80 else 128 if need <= 128 else 255
                if 32 <= threads <= 1024 and cap * threads <= 65536:
                    out.append(dict(path="register", threads=threads, items=items, smem=0, packed=packed))
    for threads, items, smem in HYBRID:
        if threads * items < v <= threads * (items + smem):
            out.append(dict(path="hybrid", threads=threads, items=items, smem=smem, packed=True))
    for threads, items, smem, packed in SPLIT:
        splits = -(-v // (threads * (items + smem)))
        if 2 <= splits <= min(MAX_SPLITS, sms) and rows * splits < 2**31:
            out.append(dict(path="split", threads=threads, items=items, smem=smem, packed=packed, splits=splits))
    for threads in (256, 512, 1024):
        out.append(dict(path="stream", threads=threads, items=8, smem=0, packed=False))
    return out


def describe(c: dict) -> str:
    s = f"{c['path']} {c['threads']}x{c['items']}"
    if c.get("smem"):
        s += f"+{c['smem']}smem"
    if c.get("packed"):
        s += " packed"
    if c.get("splits"):
        s += f" ({c['splits']} slices)"
    return s


def load_ce_tuning() -> float:
    """Build (or load) the extension of launch variants (csrc/cross_entropy_tuning*.{cu,cpp}); returns seconds."""
    return load_tuning("softmax_harness_cuda_ce_tuning",
                       ["cross_entropy_tuning_binding.cpp", "cross_entropy_tuning.cu", "cross_entropy_tuning_split.cu"],
                       [*DEVICE_HEADERS, *CE_DEVICE_HEADERS, CSRC / "cross_entropy_tuning.h"])


def ce_inputs(rows: int, v: int, seed: int = 0):
    """(bf16 logits rows x v, targets in range with 1% ignored, 1 / n_valid) on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, v, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    t[torch.rand(rows, device="cuda", generator=g) < 0.01] = IGNORE
    inv = (t != IGNORE).sum().clamp(min=1).to(torch.float32).reciprocal()
    return x, t, inv


def reference_loss(x: torch.Tensor, t: torch.Tensor, chunk: int) -> torch.Tensor:
    """The per-row losses in float64, ``chunk`` rows at a time (0 on ignored rows)."""
    out = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[0], chunk):
        x64 = x[s:s + chunk].double()
        tt = t[s:s + chunk]
        valid = tt != IGNORE
        ts = torch.where(valid, tt, 0)
        loss = torch.logsumexp(x64, -1) - x64.gather(1, ts[:, None])[:, 0]
        out[s:s + chunk] = torch.where(valid, loss, 0.0)
    return out


def check(loss: torch.Tensor, grad: torch.Tensor, x: torch.Tensor, t: torch.Tensor, inv: torch.Tensor,
          ref_loss: torch.Tensor, chunk: int) -> tuple[float, float]:
    """(max relative error of the per-row losses, ||grad - ref|| / ||ref|| of the gradient), float64."""
    loss_err = ((loss.double() - ref_loss).abs() / ref_loss.abs().clamp(min=1.0)).max().item()
    num = den = 0.0
    for s in range(0, x.shape[0], chunk):
        x64 = x[s:s + chunk].double()
        tt = t[s:s + chunk]
        valid = tt != IGNORE
        p = torch.softmax(x64, -1)
        p.scatter_add_(1, torch.where(valid, tt, 0)[:, None], -valid[:, None].double())
        p = torch.where(valid[:, None], p * inv.double(), 0.0)
        num += (grad[s:s + chunk].double() - p).square().sum().item()
        den += p.square().sum().item()
    return loss_err, math.sqrt(num / den) if den > 0 else math.sqrt(num)


def _timed(run, rep_ms: int, nbytes: int, copy_gbs: float) -> dict:
    graph_ms, graphed = bench_graph_ms(run, rep_ms)
    eager_ms = bench_ms(run, rep_ms)
    gbs = nbytes / (graph_ms * 1e-3) / 1e9
    return {"graph_ms": graph_ms, "graphed": graphed, "eager_ms": eager_ms, "gbs": gbs, "of_copy": gbs / copy_gbs}


def run_ce_sweep(sizes: list[int], rows: int, max_gb: float, out: Path, rep_ms: int = 50,
                 match: str = "") -> list[dict]:
    prep = prepare()
    build_s = load_ce_tuning()
    ops = torch.ops.softmax_harness_cuda_ce_tuning
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_gbs = copy_bandwidth("cuda")
    print(f"ce-sweep: variants built in {build_s:.1f} s (extension {prep.get('build_s', 0):.1f} s); copy "
          f"{copy_gbs:.0f} GB/s; {torch.cuda.get_device_name()}, {sms} SMs", flush=True)
    results: list[dict] = []
    for v in sizes:
        n = max(512, min(rows, int(max_gb * 1e9 / (4 * v)) // 512 * 512))  # logits + gradient, bf16
        x, t, inv = ce_inputs(n, v)
        nbytes = 2 * x.numel() * x.element_size()  # the ideal: one read of the logits, one write of the gradient
        chunk = max(1, (1 << 28) // (8 * v))  # float64 reference chunks of <= 256 MiB
        ref_loss = reference_loss(x, t, chunk)
        g = torch.empty_like(x)
        tol = FWD_TOL[torch.bfloat16]
        head = {"v": v, "rows": n, "logits_gb": x.numel() * 2 / 1e9}
        mine = []

        def record(kind: str, desc: str, run, verify: bool = True, moved: int = nbytes, **extra):
            if match and match not in desc:
                return
            row = {**head, "kind": kind, "desc": desc, **extra}
            try:
                loss = run()
                if loss is not None and loss.numel() == 0:
                    return
                if verify:
                    g.fill_(float("nan"))  # an element the candidate misses stays NaN
                    loss = run()
                    row["loss_err"], row["grad_err"] = check(loss, g, x, t, inv, ref_loss, chunk)
                    row["ok"] = row["loss_err"] <= 1e-4 and row["grad_err"] <= tol
                else:
                    row["ok"] = True
                if row["ok"]:
                    row.update(_timed(run, rep_ms, moved, copy_gbs))
            except Exception as exc:  # a candidate that cannot launch here
                row["ok"] = False
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            results.append(row)
            mine.append(row)

        for c in ce_variants(v, n, sms):
            record("variant", describe(c), lambda c=c: ops.ce_variant(x, t, inv, g, _PATHS[c["path"]], c["threads"],
                                                                      c["items"], c["smem"], c["packed"]), **c)
        ce_rows = torch.ops.softmax_harness_cuda.ce_rows
        for name, code in (("auto", -1), ("register", 0), ("hybrid", 1), ("split", 2), ("stream", 3)):
            path = ce_code_path(torch.bfloat16, v, rows=n, path=name)  # auto: the launch table's choice
            if path == "none":
                continue
            record("production", f"ce_rows {name} -> {path}", lambda code=code: ce_rows(x, t, IGNORE, inv, g, code))
        # the whole op, forward + backward (grad_output 1: the backward is the scale's launch)
        xr = x.detach().requires_grad_(True)

        def op_step(fn):
            def step():
                xr.grad = None
                fn(xr).backward()
            return step

        record("op", "kernels.cross_entropy(method='cuda') fwd+bwd",
               op_step(lambda z: kernels.cross_entropy(z, t, method="cuda")), verify=False)
        record("op", "F.cross_entropy fwd+bwd (bf16 logits)",
               op_step(lambda z: F.cross_entropy(z, t, ignore_index=IGNORE)), verify=False)
        one, half = torch.ones((), device="cuda"), torch.full((), 0.5, device="cuda")
        sg = torch.ops.softmax_harness_cuda.scale_grad_
        record("scale", "scale_grad_ g=1 (skip)", lambda: sg(g, one), verify=False)
        record("scale", "scale_grad_ g=0.5 (a pass)", lambda: sg(g, half), verify=False)

        def best(path: str) -> str:
            r = max((r for r in mine if r["kind"] == "variant" and r.get("path") == path and r.get("ok")),
                    key=lambda r: r["gbs"], default=None)
            return "-" if r is None else f"{r['desc']} {r['gbs']:.0f} GB/s ({r['of_copy']:.2f})"

        bad = [r for r in mine if r["kind"] in ("variant", "production") and not r.get("ok")]
        print(f"V={v} rows={n} ({head['logits_gb']:.2f} GB of logits); wrong/failed: {len(bad)}", flush=True)
        for path in _PATHS:
            print(f"  best {path:<8s} {best(path)}", flush=True)
        for r in mine:
            if r["kind"] != "variant" and r.get("ok"):
                rate = f"{r['gbs']:.0f} GB/s ({r['of_copy']:.2f} of copy), " if r["kind"] == "production" else ""
                print(f"  {r['desc']:<48s} {rate}graph {r['graph_ms'] * 1e3:.1f} us, "
                      f"eager {r['eager_ms'] * 1e3:.1f} us", flush=True)
        for r in bad:
            why = r.get("error") or (f"loss err {r.get('loss_err', float('nan')):.1e}, "
                                     f"grad err {r.get('grad_err', float('nan')):.1e}")
            print(f"  WRONG/FAILED {r['desc']}: {why}", flush=True)
        del x, t, g, xr, ref_loss
        torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    data = {"copy_gbs": copy_gbs, "build_s": build_s, "device": torch.cuda.get_device_name(), "rows": results}
    (out / "ce_sweep.json").write_text(json.dumps(data, indent=2) + "\n")
    return results


def add_vocabulary_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments both cross-entropy sweeps take (this one and ``triton-ce-sweep``)."""
    p.add_argument("--sizes", default="32768,50304,128256,262144", help="vocabulary sizes V, comma-separated")
    p.add_argument("--rows", type=int, default=16384, help="rows (tokens) per measurement, fewer for large V")
    p.add_argument("--max-gb", type=float, default=4.0, help="bound on logits + gradient bytes (GB)")
    p.add_argument("--rep-ms", type=int, default=50)
    p.add_argument("--out", default="outputs/bench", type=Path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_vocabulary_arguments(p)
    p.add_argument("--match", default="", help="only the candidates whose description holds this text")


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[dict]:
    return run_ce_sweep(parse_ints(a.sizes), a.rows, a.max_gb, a.out, a.rep_ms, a.match)
