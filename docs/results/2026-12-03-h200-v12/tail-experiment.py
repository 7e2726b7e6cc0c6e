# Record of the session-16 experiment run on the H200 as scripts/_exp_tail.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Experiment: does the 65536 / 32768 forward lose to the persistent tail? GB/s by row count."""
import json, os, sys, torch
sys.path.insert(0, os.getcwd())
import kernels
from harness.bench import bench_graph_ms, copy_bandwidth
out = os.environ.get("OUT", "/tmp")
dev = "cuda"
res = {"copy_1g": copy_bandwidth(dev)}
for m in ("cuda", "triton"):
    kernels.get_method(m).prepare and kernels.get_method(m).prepare()
rows_for = {65536: [1848, 1980, 2048, 2112, 2244], 32768: [3960, 4096, 4224, 4356]}
for n, rl in rows_for.items():
    for r in rl:
        x = torch.randn(r, n, device=dev).to(torch.bfloat16)
        dst = torch.empty_like(x)
        cms, _ = bench_graph_ms(lambda: dst.copy_(x), 200)
        line = {"n": n, "rows": r, "waves": r / 132, "copy_gbs": 2 * x.numel() * 2 / cms / 1e6}
        for m in ("cuda", "triton"):
            fn = kernels.bind(m)
            with torch.no_grad():
                ms, _ = bench_graph_ms(lambda: fn(x, 1.0, False), 200)
            line[m] = 2 * x.numel() * 2 / ms / 1e6
        res[f"{n}x{r}"] = line
        print(f"N={n} rows={r} waves={r/132:.2f} copy(same bytes)={line['copy_gbs']:.0f} "
              f"cuda={line['cuda']:.0f} ({line['cuda']/res['copy_1g']:.3f}) triton={line['triton']:.0f} ({line['triton']/res['copy_1g']:.3f})", flush=True)
        del x, dst
# ring backward with fewer rows than SMs: old pairs formula vs new
import kernels.methods.triton_softmax as ts
for r in (5, 40, 100):
    y = torch.softmax(torch.randn(r, 65536, device=dev), -1).to(torch.bfloat16)
    dy = torch.randn_like(y)
    ms, _ = bench_graph_ms(lambda: ts.launch_bwd(y, dy, 0.7, False), 100)
    res[f"bwd_rows{r}"] = ms
    print(f"ring bwd rows={r}: {ms*1000:.1f} us  {3*y.numel()*2/ms/1e6:.0f} GB/s", flush=True)
print(f"copy 1 GiB: {res['copy_1g']:.0f} GB/s")
json.dump(res, open(f"{out}/tail.json", "w"), indent=1)
