# Record of the session-17 experiment run on the H200 as scripts/_exp_range.py (not part of the product;
# results next to this file, see docs/perf.md, "v13").
"""Experiment (session 17): the Triton forward's hybrid plan against its fallback plan (gluon=False:
the persistent tile up to 32768, the long path beyond) at row lengths the benchmark table skips, bf16,
rows x N ~ 2^27, same process, ABA order."""
import json, os, sys, statistics, torch
sys.path.insert(0, os.getcwd())
import kernels
import kernels.methods.triton_softmax as ts
from harness.bench import bench_graph_ms, copy_bandwidth

out = os.environ.get("OUT", "/tmp")
copy = copy_bandwidth("cuda")
res = {"copy": copy, "rows": []}
print(f"copy {copy:.0f} GB/s", flush=True)
for n in (16392, 20480, 24576, 28672, 40000, 57344):
    rows = 2**27 // n
    x = torch.randn(rows, n, device="cuda").mul_(2).to(torch.bfloat16)
    ref = torch.softmax(x.float() * 0.7, -1)
    plans = {"hybrid": ts.plan(n, 2), "fallback": ts.plan(n, 2, gluon=False)}
    assert plans["hybrid"].hybrid
    fns = {k: (lambda p=p: ts.launch_fwd(x, 0.7, False, p)) for k, p in plans.items()}
    for k, fn in fns.items():
        assert kernels.relative_error(fn(), ref) <= kernels.FWD_TOL[torch.bfloat16], k
    times = {k: [] for k in fns}
    for order in (list(fns), list(fns)[::-1], list(fns)):
        for k in order:
            times[k].append(bench_graph_ms(fns[k], 100)[0])
    line = f"N={n} rows={rows}"
    for k, t in times.items():
        gbs = 2 * x.numel() * 2 / statistics.median(t) / 1e6
        res["rows"].append({"n": n, "rows": rows, "plan": k, "desc": str(plans[k]), "ms": t, "gbs": gbs, "frac": gbs / copy})
        line += f" | {k} {gbs:.0f} GB/s {gbs / copy:.3f}"
    print(line, flush=True)
    del x, ref
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/triton-hybrid-range.json", "w"), indent=1)
