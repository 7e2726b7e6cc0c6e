"""Run one softmax method's kernels a few times on rows x N scores, for a profiler to attach to.

Meant to run under Nsight Compute on a GPU host (`scripts/device.sh profile` does that), e.g.

    ncu --clock-control none -k regex:fwd_persist --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python scripts/profile_softmax.py --method cuda --n 65536

Each call runs the forward (and, with --direction bwd or both, the backward of its output) on the
same bf16 (or --dtype) scores of rows x N = --elements elements: one warm-up call (first-use builds,
JIT), then --repeat calls, so `--launch-skip` should skip the warm-up call's launches of the kernels
the filter selects. Prints the method's code path where it has one (`cuda`). On a CPU it runs too
(any CPU-capable method), which is what the test suite checks.
"""

from __future__ import annotations

import argparse

import torch

import kernels
from harness.bench.timing import warm_then_repeat


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="cuda", help="a softmax method (kernels.available_methods())")
    p.add_argument("--n", type=int, default=65536, help="row length N")
    p.add_argument("--elements", type=int, default=2**27, help="rows x N (default 2^27)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--direction", default="fwd", choices=["fwd", "bwd", "both"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    if a.n < 1 or a.elements < a.n or a.repeat < 1:
        p.error("need N >= 1, --elements >= N and --repeat >= 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, a.dtype)
    rows = a.elements // a.n
    method = kernels.get_method(a.method)
    if method.prepare is not None:
        method.prepare()
    x = (torch.randn(rows, a.n, device=device) * 2).to(dtype)
    dy = torch.randn_like(x)
    if a.method == "cuda":
        from kernels.methods.cuda import code_path

        for bwd in (False, True):
            print(f"cuda {'backward' if bwd else 'forward'} path: {code_path(dtype, bwd, a.n, rows=rows)}")

    def once() -> None:
        xx = x.requires_grad_(a.direction != "fwd")
        y = kernels.softmax(xx, scale=1.0, causal=a.causal, method=a.method)
        if a.direction != "fwd":
            torch.autograd.grad(y, xx, dy)

    warm_then_repeat(once, a.repeat)
    print(f"{a.method}: {a.repeat} x {a.direction} on {rows} x {a.n} {a.dtype} ({device})")


if __name__ == "__main__":
    main()
