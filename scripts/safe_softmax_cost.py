"""What it would cost the `torch` method to return zeros (not NaN) for an input row that is all -inf.

The `torch` method is scale + masked_fill + torch.softmax, what a PyTorch user writes; torch.softmax
gives NaN for an all -inf row. The fix that keeps NaN propagating from NaN inputs is PyTorch's own
`torch._safe_softmax` (zeros for rows that are all -inf), which adds passes over the scores. This times
both chains on the attention-shaped causal scores, forward and forward + backward, in bf16 and with the
softmax in fp32 (what bf16 autocast does to torch.softmax in training; spelled out, since
`_safe_softmax` has no autocast rule). GPU only. Usage:
    python scripts/safe_softmax_cost.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from harness.bench.timing import bench_graph_ms
from kernels.common import causal_mask


def chain(x: torch.Tensor, safe: bool, fp32: bool) -> torch.Tensor:
    s = x * 0.125
    s = s.masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    s = s.float() if fp32 else s
    y = torch._safe_softmax(s, -1) if safe else torch.softmax(s, -1)
    return y.to(x.dtype)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    x = torch.randn(8, 12, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    rows = {}
    for mode in ("bf16", "fp32"):
        for safe in (False, True):
            def fwd():
                return chain(x, safe, mode == "fp32")

            def fwd_bwd():
                return torch.autograd.grad(fwd(), x, dy)

            f, _ = bench_graph_ms(fwd)
            fb, _ = bench_graph_ms(fwd_bwd)
            rows[f"{mode}-{'safe' if safe else 'plain'}"] = {"fwd_ms": f, "fwd_bwd_ms": fb}
        plain, safe = rows[f"{mode}-plain"], rows[f"{mode}-safe"]
        print(f"{mode} softmax: torch.softmax fwd {plain['fwd_ms']:.4f} ms, fwd+bwd {plain['fwd_bwd_ms']:.4f} ms | "
              f"_safe_softmax fwd {safe['fwd_ms']:.4f} ({safe['fwd_ms'] / plain['fwd_ms']:.2f}x), "
              f"fwd+bwd {safe['fwd_bwd_ms']:.4f} ({safe['fwd_bwd_ms'] / plain['fwd_bwd_ms']:.2f}x)", flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
