# Record of the session-16 experiment run on the H200 as scripts/_exp_hint.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Experiment: L2 evict-first hints on the loads and streaming (.cs) stores, CUDA persistent forward and
Triton ring forward, bf16, same run, each variant timed twice (ABCD DCBA order)."""
import json, os, sys, statistics, torch
sys.path.insert(0, os.getcwd())
import kernels.methods.triton_softmax as ts
from scripts._exp_hintk import _fwd_ring_hint_kernel
from harness.bench import bench_graph_ms, copy_bandwidth

out = os.environ.get("OUT", "/tmp")
flags = {"plain": [], "load": ["-DSOFTMAX_LOAD_HINT=1"], "store": ["-DSOFTMAX_STORE_CS=1"],
         "both": ["-DSOFTMAX_LOAD_HINT=1", "-DSOFTMAX_STORE_CS=1"]}
MODE = sys.argv[1:] or ["ring"]
libs = {}
if MODE[0] == "cuda":  # the cuda method itself, its extension built with this variant's flags
    import torch.utils.cpp_extension as ce
    import kernels
    real_load = ce.load

    def hinted_load(**kw):
        kw["name"] = f"softmax_harness_cuda_{MODE[1]}"
        kw["extra_cuda_cflags"] = kw["extra_cuda_cflags"] + flags[MODE[1]]
        return real_load(**kw)

    ce.load = hinted_load
    print("build", kernels.get_method("cuda").prepare(), flush=True)
    libs = {MODE[1]: kernels.bind("cuda")}


def cuda_fwd(fn, x, y):
    with torch.no_grad():
        return fn(x, 0.7, False)


def ring_fwd(x, y, lh, sh):
    n_rows, n_cols = x.shape
    p = ts.plan(65536, 2)  # the ring plan (32 warps, 13 slots) at every N here
    vec, chunk, nch = ts._ring_shape(x, p)
    _fwd_ring_hint_kernel[(ts._persistent_grid(n_rows, x.device, p),)](
        x, y, n_rows, n_cols // 8, x.stride(0) // 8, 0.7 * ts.LOG2E, VEC=8, NCH=nch, SLOTS=ts.ring_slots(x.device, p),
        EVEN=n_cols % chunk == 0, LOADH=lh, STOREH=sh, num_warps=p.num_warps)
    return y


copy = copy_bandwidth("cuda")
print(f"copy {copy:.0f} GB/s", flush=True)
res = {"copy": copy, "rows": []}
for n, rows in ((65536, 2048), (65536, 2112), (49152, 2730), (32768, 4096)) if MODE[0] == "ring" else ((65536, 2048), (65536, 2112)):
    x = torch.randn(rows, n, device="cuda").mul_(2).to(torch.bfloat16)
    y = torch.empty_like(x)
    ref = torch.softmax(x.float() * 0.7, -1)
    v = {}
    for k, lib in libs.items():
        v[f"cuda {k}"] = lambda lib=lib: cuda_fwd(lib, x, y)
    for lh, sh, name in ((False, "", "plain"), (True, "", "load"), (False, ".cs", "store"), (True, ".cs", "both")):
        if MODE[0] == "ring":
            v[f"ring {name}"] = lambda lh=lh, sh=sh: ring_fwd(x, y, lh, sh)
    times = {k: [] for k in v}
    for k, fn in v.items():
        y.zero_()
        err = (fn().float() - ref).abs().max().item()
        assert err < 1e-2, (k, err)
    for order in (list(v), list(v)[::-1]):
        for k in order:
            ms, _ = bench_graph_ms(v[k], 200)
            times[k].append(ms)
    for k, t in times.items():
        gbs = 2 * x.numel() * 2 / statistics.median(t) / 1e6
        res["rows"].append({"n": n, "rows": rows, "variant": k, "ms": t, "gbs": gbs, "frac": gbs / copy})
        print(f"N={n} rows={rows} {k:12s} {gbs:.0f} GB/s {gbs / copy:.3f}  (runs {[round(2 * x.numel() * 2 / m / 1e6) for m in t]})", flush=True)
    del x, y, ref
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/hint-{'-'.join(MODE)}.json", "w"), indent=1)
