"""The launch-variant sweep of the `cuda` method: how the launch table in ``csrc/softmax_kernels.cu`` was
chosen (``python -m harness.bench cuda-sweep``, GPU and nvcc only). Builds the variants in
``csrc/softmax_tuning*.cu`` as their own extension (bf16, not causal: see ``csrc/softmax_tuning.h``),
checks each against the float64 references and times it; writes ``cuda_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from harness.bench.common import parse_ints
from harness.bench.softmax import DEFAULT_SIZES
from harness.bench.timing import bench_graph_ms, copy_bandwidth, error_on_device, sweep_references
from kernels.methods.cuda.build import CSRC, DEVICE_HEADERS, LDFLAGS, headers_flag
from kernels.reference import BWD_TOL, FWD_TOL

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


def load_tuning(name: str, sources: list[str], headers: list) -> float:
    """Build (or load) an extension of launch variants from csrc/ (sources: file names; headers: what a
    rebuild follows, see ``headers_flag``), as the method's own build is made; returns seconds."""
    from torch.utils.cpp_extension import load  # (lazy: it imports setuptools; only a sweep on a GPU needs it)

    t0 = time.perf_counter()
    load(name=name, sources=[str(CSRC / s) for s in sources], extra_cflags=["-O3"], extra_include_paths=[str(CSRC)],
         extra_cuda_cflags=["-O3", headers_flag(headers)], extra_ldflags=LDFLAGS, is_python_module=False,
         verbose=False)
    return time.perf_counter() - t0


def load_cuda_tuning() -> float:
    """Build (or load) the extension of launch variants (csrc/softmax_tuning*.{cu,cpp}); returns seconds."""
    return load_tuning("softmax_harness_cuda_tuning",
                       ["softmax_tuning_binding.cpp", "softmax_tuning.cu", "softmax_tuning_persist.cu"],
                       [*DEVICE_HEADERS, CSRC / "softmax_tuning.h"])


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
                want, tol, moved = ref, FWD_TOL[torch.bfloat16], 2 * nbytes
            else:
                run = lambda: ops.bwd_variant(y, dy, v["items"], v["cap"], path, v["threads"], v["buffers"], v["ctas"])  # noqa: E731
                want, tol, moved = dref, BWD_TOL[torch.bfloat16], 3 * nbytes
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
    _write_json(out / "cuda_sweep.json", {"copy_gbs": copy_gbs, "build_s": build_s, "rows": results})
    return results


def _write_json(path: Path, data: dict) -> None:
    """Written atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--elements", type=int, default=2**27)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[dict]:
    a.out.mkdir(parents=True, exist_ok=True)
    return run_cuda_sweep(parse_ints(a.sizes), a.elements, a.out)
