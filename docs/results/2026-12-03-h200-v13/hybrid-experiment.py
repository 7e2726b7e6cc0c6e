# Record of the session-17 experiment run on the H200 as scripts/_exp_hyb.py (not part of the product;
# results next to this file, see docs/perf.md, "v13").
"""Experiment (session 17): the hybrid forward against the landed persistent forward (same process,
ABBA order), plus correctness of the hybrid on causal, partial, negative-scale and fp16 rows."""
import json, os, sys, statistics, time, torch
sys.path.insert(0, os.getcwd())
from torch.utils.cpp_extension import load
from harness.bench import bench_graph_ms, copy_bandwidth

out = os.environ.get("OUT", "/tmp")
t0 = time.time()
lib = load(name="exp_hyb", sources=["scripts/_exp_hyb_binding.cpp", "scripts/_exp_hyb.cu"],
           extra_cflags=["-O3"], extra_include_paths=[os.getcwd() + "/csrc"], extra_cuda_cflags=["-O3", "-std=c++17"], verbose=False)
print(f"built in {time.time() - t0:.0f} s", flush=True)
SPAN = {0: (0, 65536), 1: (32768, 65536), 2: (16384, 65536), 3: (16384, 65536), 4: (32768, 49152)}
NAMES = {0: "persist(landed)", 1: "hyb512x64+64", 2: "hyb512x32+96", 3: "hyb256x64+192", 4: "hyb512x64+32"}


def reference(x, scale, causal, tq, diag):
    s = x.double() * scale
    if causal:
        r = torch.arange(x.shape[0], device=x.device) % tq
        keep = torch.arange(x.shape[1], device=x.device)[None, :] <= (r + diag)[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


res = {"checks": [], "rows": []}
bad = 0
for v in (0, 1, 2, 3, 4):
    for dt in (torch.bfloat16, torch.float16):
        for n, rows, causal, tq, diag, scale in ((65536, 7, False, 1, 0, 0.7), (65536, 5, False, 1, 0, -1.3),
                                                 (40000, 6, False, 1, 0, 0.125), (65536, 40, True, 20, 65536 - 20, 0.125),
                                                 (65536, 30, True, 30, 65536 - 40000, 1.0), (50000, 9, True, 9, -3, 2.0),
                                                 (33000, 4, False, 1, 0, 1.0)):
            if not SPAN[v][0] < n <= SPAN[v][1]:
                continue
            x = (torch.randn(rows, n, device="cuda") * 3).to(dt)
            print("check", NAMES[v], dt, n, rows, causal, flush=True)
            try:
                y = lib.run(v, x, scale, causal, tq, diag)
            except RuntimeError as e:
                res["checks"].append({"v": v, "n": n, "skip": str(e)[:80]})
                continue
            err = (y.double() - reference(x, scale, causal, tq, diag)).abs().max().item()
            ok = err < (2e-3 if dt == torch.float16 else 8e-3)
            bad += not ok
            res["checks"].append({"v": v, "dt": str(dt), "n": n, "rows": rows, "causal": causal, "scale": scale, "err": err, "ok": ok})
            if not ok:
                print("WRONG", NAMES[v], dt, n, rows, causal, tq, diag, scale, err, flush=True)
print(f"correctness: {bad} wrong of {sum(1 for c in res['checks'] if 'ok' in c)}", flush=True)

copy = copy_bandwidth("cuda")
res["copy"] = copy
print(f"copy {copy:.0f} GB/s", flush=True)
for n, rows, vs in ((65536, 2048, (0, 1, 2, 3)), (65536, 2112, (0, 1, 2, 3)), (65536, 2112 * 2, (0, 1)), (49152, 2730, (0, 4, 1))):
    x = torch.randn(rows, n, device="cuda").mul_(2).to(torch.bfloat16)
    ref = torch.softmax(x.float() * 0.7, -1)
    fns = {}
    for v in vs:
        if not SPAN[v][0] < n <= SPAN[v][1]:
            continue
        try:
            y = lib.run(v, x, 0.7, False, 1, 0)
        except RuntimeError as e:
            print("skip", NAMES[v], n, str(e)[:60]); continue
        err = (y.float() - ref).abs().max().item()
        assert err < 1e-2, (v, err)
        fns[v] = lambda v=v: lib.run(v, x, 0.7, False, 1, 0)
    times = {k: [] for k in fns}
    for order in (list(fns), list(fns)[::-1], list(fns)):
        for k in order:
            ms, _ = bench_graph_ms(fns[k], 200)
            times[k].append(ms)
    for k, t in times.items():
        gbs = 2 * x.numel() * 2 / statistics.median(t) / 1e6
        res["rows"].append({"n": n, "rows": rows, "variant": NAMES[k], "ms": t, "gbs": gbs, "frac": gbs / copy})
        print(f"N={n} rows={rows} {NAMES[k]:16s} {gbs:.0f} GB/s {gbs / copy:.3f}  (runs {[round(2 * x.numel() * 2 / m / 1e6) for m in t]})", flush=True)
    del x, ref
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/hybrid-experiment.json", "w"), indent=1)
