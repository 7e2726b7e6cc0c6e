# Record of the session-16 experiment run on the H200 as scripts/_exp_pairs_bwd.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Ring backward with fewer rows than SMs: the landed pairs count vs the old one, same run."""
import os, sys, torch
sys.path.insert(0, os.getcwd())
import kernels.methods.triton_softmax as ts
from harness.bench import bench_graph_ms
new = ts._persistent_grid
for r in (1, 5, 40, 100, 131, 300):
    y = torch.softmax(torch.randn(r, 65536, device="cuda"), -1).to(torch.bfloat16)
    dy = torch.randn_like(y)
    out = {}
    for name in ("new", "old"):
        if name == "old":  # the old count: min(rows, min(rows, SMs) // 2) pairs
            ts._persistent_grid = lambda n, d, p: new(n // 2, d, p)  # called with 2 x rows: min(rows, SMs)
        else:
            ts._persistent_grid = new
        ref = ts.launch_bwd(y, dy, 0.7, False)
        ms, _ = bench_graph_ms(lambda: ts.launch_bwd(y, dy, 0.7, False), 100)
        out[name] = (ms, ref)
    ts._persistent_grid = new
    same = torch.equal(out["new"][1], out["old"][1])
    print(f"ring bwd rows={r}: new {out['new'][0]*1000:.1f} us, old {out['old'][0]*1000:.1f} us, "
          f"old/new {out['old'][0]/out['new'][0]:.2f}, same dx {same}", flush=True)
