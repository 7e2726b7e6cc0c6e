"""Experiment (not for landing): causal forward at several T, the fill plan (default now) vs the tile plan
the table had before (same rows/warps table as before this change), and CUDA, same run."""
import json, os, sys
import torch
from harness.bench import bench_graph_ms
from kernels.methods import triton_softmax as ts
from kernels.methods import cuda_softmax as cs

OLD_FWD_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8), 8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}


def old_plan(t):
    if t == 1024:
        return ts.Plan(False, 1024, 1, 1, False)
    rows, warps = OLD_FWD_TILE[t]
    return ts.Plan(False, t, rows, warps)


def main():
    cs.prepare()
    out = {}
    for t in [int(v) for v in sys.argv[1].split(",")]:
        bh = max(1, 2**27 // (t * t))
        x = torch.randn((bh, 1, t, t), device="cuda").to(torch.bfloat16)
        ref = torch.softmax((x.float() * 0.125).masked_fill(~torch.ones(t, t, dtype=torch.bool, device="cuda").tril(), float("-inf")), -1)
        row = {}
        for name, fn in (("new", lambda: ts.launch_fwd(x, 0.125, True)), ("old", lambda: ts.launch_fwd(x, 0.125, True, old_plan(t))),
                         ("cuda", lambda: cs.cuda_softmax(x, 0.125, True))):
            err = (fn().float() - ref).abs().max().item()
            row[name] = bench_graph_ms(fn)[0]
            row[name + "_err"] = err
        row["plan"] = str(ts.plan(t, 2, causal=True))
        out[t] = row
        print(f"T={t}: new {row['new']:.4f} old {row['old']:.4f} cuda {row['cuda']:.4f} new/old {row['new']/row['old']:.3f} "
              f"new/cuda {row['new']/row['cuda']:.3f} errs {row['new_err']:.1e} {row['old_err']:.1e} {row['cuda_err']:.1e} {row['plan']}", flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "causal-compare.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
