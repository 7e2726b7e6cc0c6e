"""Run one attention method's kernels a few times at (B, H, T, d), for a profiler to attach to.

Meant to run under Nsight Compute on a GPU host (`scripts/device.sh profile-attention` does that), e.g.

    ncu --clock-control none -k regex:_fwd --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python scripts/profile_attention.py --shape 16,12,1024,64 --fwd "gluon=2 block_m=192 persistent=1 overlap=1"

Each call runs the causal forward (and, with --direction bwd or both, the backward of its output) on the same
bf16 (or --dtype) q, k, v in the model's (B, T, H, d) memory layout: one warm-up call (JIT, first-use builds),
then --repeat calls, so `--launch-skip` should skip the warm-up call's launches of the kernels the filter
selects. For `flash`, --fwd and --bwd set plan knobs over the table's plan for the shape (as the sweep's
phases and `python -m harness.bench flash-compile-check` take them: knob=value ...), and the plans run
are printed. On a CPU it runs too (methods that run there; flash in Triton's interpreter), which is what
the test suite checks.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

import kernels
from harness.bench.timing import warm_then_repeat


def _plans(shape: tuple, dtype: torch.dtype, fwd: str, bwd: str, error):
    """The flash plans for the shape: the table's (plans_for), with the given knobs over them."""
    from kernels.methods.flash import plan as plans
    from harness.bench.tuning.flash_sweep import knobs_over

    _, _, t, d = shape
    f0, b0 = plans.plans_for(d, d, dtype, True, t, t)
    try:
        return knobs_over(f0, fwd), knobs_over(b0, bwd)
    except ValueError as exc:  # several values, phases, or knobs that make no plan
        error(f"--fwd / --bwd: {exc}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="flash", help="an attention method (kernels.available_methods(op='attention'))")
    p.add_argument("--shape", default="16,12,1024,64", help="B,H,T,d")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--direction", default="fwd", choices=["fwd", "bwd", "both"])
    p.add_argument("--fwd", default="", help="flash: forward plan knobs over the table's (knob=value ...)")
    p.add_argument("--bwd", default="", help="flash: backward plan knobs over the table's")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    try:
        shape = tuple(int(v) for v in a.shape.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1 or a.repeat < 1:
        p.error(f"--shape takes B,H,T,d (four positive integers; got {a.shape!r}) and --repeat >= 1")
    if (a.fwd or a.bwd) and a.method != "flash":
        p.error(f"--fwd and --bwd set the flash method's plans; got --method {a.method}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, a.dtype)
    method = kernels.get_method(a.method)
    if method.prepare is not None:
        method.prepare()
    use = contextlib.nullcontext()
    if a.method == "flash":
        from kernels.methods.flash import plan as plans

        fp, bp = _plans(shape, dtype, a.fwd, a.bwd, p.error)
        print(f"flash plans: {fp}\n             {bp}")
        use = plans.override(fp, bp)
    b, h, t, d = shape
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn((b, t, h, d), device=device, generator=g).to(dtype).transpose(1, 2) for _ in range(4))
    fn = kernels.bind(a.method, "attention")

    def once() -> None:
        grad = a.direction != "fwd"
        qq, kk, vv = (x.detach().requires_grad_(grad) for x in (q, k, v))
        out = fn(qq, kk, vv, None, True, 0.0)
        if grad:
            torch.autograd.grad(out, (qq, kk, vv), do)

    with use:
        warm_then_repeat(once, a.repeat)
    print(f"{a.method}: {a.repeat} x {a.direction} at {shape} {a.dtype} (causal), after one warm-up call")


if __name__ == "__main__":
    main()
