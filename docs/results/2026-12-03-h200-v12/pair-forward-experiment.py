# Record of the session-16 experiment run on the H200 as scripts/_exp_pair.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Experiment: ring forward with 2 programs per SM (32768) and a row split over a pair of programs
(forward pair ring, 65536), against the landed ring / persistent plans, same run."""
import json, os, sys, torch
sys.path.insert(0, os.getcwd())
import kernels
import kernels.methods.triton_softmax as ts
from kernels.methods.triton_softmax import _ring_start, _ring_copy, _ring_wait, _ring_load, Plan, LOG2E
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from harness.bench import bench_graph_ms, copy_bandwidth


from scripts._exp_pairk import _fwd_pair_ring_kernel


SMS = torch.cuda.get_device_properties(0).multi_processor_count


def pair_fwd(x2, scale, warps, slots, pps):
    n_rows, n_cols = x2.shape
    vec = 8
    chunk = vec * 32 * warps
    nch = -(-(-(-n_cols // 2)) // chunk)
    assert nch <= slots
    y = torch.empty_like(x2)
    pairs = max(1, min(n_rows, SMS * pps // 2))
    xch = torch.zeros(2 * n_rows, dtype=torch.int64, device=x2.device)
    _fwd_pair_ring_kernel[(2 * pairs,)](x2, y, xch, n_rows, n_cols // vec, x2.stride(0) // vec, scale * LOG2E,
                                        VEC=vec, NCH=nch, SLOTS=slots, num_warps=warps)
    return y


def ring_fwd(x2, scale, warps, slots, pps):
    p = Plan(False, 65536, 1, warps, ring=True, slots=slots, programs_per_sm=pps)
    y = torch.empty_like(x2)
    ts._launch_ring(x2, y, scale, p)
    return y


out = os.environ.get("OUT", "/tmp")
copy = copy_bandwidth("cuda")
res = {"copy": copy, "rows": []}
print(f"copy {copy:.0f} GB/s", flush=True)
cuda = kernels.bind("cuda"); kernels.get_method("cuda").prepare()
for n in (65536, 32768, 49152):
    x = torch.randn(2**27 // n, n, device="cuda").mul_(2).to(torch.bfloat16)
    x[3, 5] = 1e30; x[4] = -float("inf")
    ref = torch.softmax(x.float() * 0.7, -1)
    cands = [("landed", lambda: ts.launch_fwd(x, 0.7, False)), ("cuda", lambda: cuda(x, 0.7, False))]
    for w, s, pps in ((16, 13, 2), (16, 12, 2), (8, 26, 2), (32, 6, 2), (32, 7, 2), (32, 13, 1), (16, 24, 1)):
        cands.append((f"pair w{w} s{s} pps{pps}", lambda w=w, s=s, pps=pps: pair_fwd(x, 0.7, w, s, pps)))
    for w, s, pps in ((16, 13, 2), (16, 12, 2), (8, 26, 2), (8, 18, 3), (32, 6, 2)):
        chunk = 8 * 32 * w
        if -(-n // chunk) <= s:
            cands.append((f"ring w{w} s{s} pps{pps}", lambda w=w, s=s, pps=pps: ring_fwd(x, 0.7, w, s, pps)))
    for name, fn in cands:
        r = {"n": n, "variant": name}
        try:
            with torch.no_grad():
                y = fn()
                err = ((y.float() - ref).abs().max()).item()
                r["max_err"] = err
                r["ok"] = err < 2e-2 and bool(torch.isfinite(y.float()).all())
                ms, _ = bench_graph_ms(fn, 200)
            r["gbs"] = 2 * x.numel() * 2 / ms / 1e6
            r["frac"] = r["gbs"] / copy
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["rows"].append(r)
        print(f"N={n} {name:22s} " + (f"{r['gbs']:.0f} GB/s {r['frac']:.3f} ok={r['ok']} err={r['max_err']:.2e}" if "gbs" in r else r.get("error", "")), flush=True)
    del x, ref
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/pair.json", "w"), indent=1)
