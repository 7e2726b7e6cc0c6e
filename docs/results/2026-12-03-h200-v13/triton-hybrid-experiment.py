# Record of the session-17 experiment run on the H200 as scripts/_exp_thyb.py (not part of the product;
# results next to this file, see docs/perf.md, "v13").
"""Experiment (session 17): the Gluon hybrid forward (scripts/_exp_thyb_k.py) against the landed Triton
forward (ts.launch_fwd: the ring at 32769-65536, the persistent tile at 32768), same process, ABA order;
correctness first (float64 reference, bf16 and fp16, odd lengths, negative scale, special values)."""
import json, os, sys, statistics, torch
sys.path.insert(0, os.getcwd())
import kernels.methods.triton_softmax as ts
import scripts._exp_thyb_k as hk
import kernels
from harness.bench import bench_graph_ms, copy_bandwidth

out = os.environ.get("OUT", "/tmp")


def hyb(x, scale, nr, w, maxnreg):
    rows, n = x.shape
    t = 32 * w
    nvec = n // 8
    ns = -(-(nvec - nr * t) // t)
    assert ns >= 1 and nvec > nr * t
    y = torch.empty_like(x)
    bf = x.dtype == torch.bfloat16
    hk._fwd_hybrid_kernel[(rows,)](x, y, x.view(torch.int32), y.view(torch.int32), nvec, x.stride(0) // 8,
                                   scale * ts.LOG2E, NR=nr, NS=ns, EVEN=nvec == (nr + ns) * t,
                                   UNPACK=(hk.UNPACK_BF16 if bf else hk.UNPACK_F16).value,
                                   PACK=(hk.PACK_BF16 if bf else hk.PACK_F16).value, num_warps=w, maxnreg=maxnreg)
    return y


VARIANTS = {65536: [(4, 16, 64), (8, 16, 64)], 49152: [(4, 16, 64), (8, 16, 64)], 32768: [(4, 16, 64), (2, 16, 40)]}
res = {"checks": [], "rows": []}
bad = 0
for n, vs in ((65536, VARIANTS[65536]), (40000, VARIANTS[65536]), (33000, VARIANTS[49152]), (49152, VARIANTS[49152]),
              (32768, VARIANTS[32768]), (20000, VARIANTS[32768])):
    for nr, w, mr in vs:
        if not n > nr * 32 * w * 8:
            continue
        for dt in (torch.bfloat16, torch.float16):
            for scale in (0.7, -1.3):
                g = torch.Generator(device="cuda").manual_seed(n)
                x = (torch.randn(6, n, device="cuda", generator=g) * 3).to(dt)
                x[0, :7] = float("-inf")
                x[1] = float("-inf")
                x[2, 5] = float("nan")
                x[3, n - 1] = float("inf")
                ref = kernels.reference_softmax(x, scale=scale)
                y = hyb(x, scale, nr, w, mr)
                nan_rows = ref.isnan().all(-1)
                nan_ok = torch.equal(y.isnan().all(-1), nan_rows) and not y[~nan_rows].isnan().any()
                err = kernels.relative_error(y[~nan_rows], ref[~nan_rows])
                ok = nan_ok and err <= kernels.FWD_TOL[dt] and bool((y[1] == 0).all()) == (scale > 0)
                bad += not ok
                res["checks"].append({"n": n, "nr": nr, "w": w, "dt": str(dt), "scale": scale, "err": err, "nan_ok": nan_ok, "ok": ok})
                if not ok:
                    print("WRONG", n, nr, w, dt, scale, err, nan_ok, flush=True)
print(f"correctness: {bad} wrong of {len(res['checks'])}", flush=True)
if os.environ.get("CHECKS_ONLY"):
    json.dump(res, open(f"{out}/triton-hybrid-checks.json", "w"), indent=1)
    sys.exit(0)

copy = copy_bandwidth("cuda")
res["copy"] = copy
print(f"copy {copy:.0f} GB/s", flush=True)
for n, rows in ((65536, 2048), (65536, 2112), (49152, 2730), (32768, 4096)):
    x = torch.randn(rows, n, device="cuda").mul_(2).to(torch.bfloat16)
    ref = torch.softmax(x.float() * 0.7, -1)
    fns = {"landed": lambda: ts.launch_fwd(x, 0.7, False)}
    for nr, w, mr in VARIANTS[n]:
        fns[f"hyb nr={nr} w={w} maxnreg={mr}"] = lambda nr=nr, w=w, mr=mr: hyb(x, 0.7, nr, w, mr)
    for k, fn in fns.items():
        err = (fn().float() - ref).abs().max().item()
        assert err < 1e-2, (k, err)
    times = {k: [] for k in fns}
    for order in (list(fns), list(fns)[::-1], list(fns)):
        for k in order:
            ms, _ = bench_graph_ms(fns[k], 200)
            times[k].append(ms)
    for k, t in times.items():
        gbs = 2 * x.numel() * 2 / statistics.median(t) / 1e6
        res["rows"].append({"n": n, "rows": rows, "variant": k, "ms": t, "gbs": gbs, "frac": gbs / copy})
        print(f"N={n} rows={rows} {k:26s} {gbs:.0f} GB/s {gbs / copy:.3f}  (runs {[round(2 * x.numel() * 2 / m / 1e6) for m in t]})", flush=True)
    del x, ref
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/triton-hybrid-experiment.json", "w"), indent=1)
