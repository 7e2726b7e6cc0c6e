"""Benchmarks: ``python -m harness.bench <table>`` (or ``harness-bench``).

* ``kernels``: the softmax table (harness.bench.softmax): GB/s vs N, forward and backward, eager and
  graph replay, against the copy ceiling and the baselines, every softmax method by default;
* ``loss``: the cross-entropy table (harness.bench.loss): ms and fraction of the one-read-one-write
  ideal at V = 32768 .. 262144, extra memory, and the linear cross-entropy (no full logits);
* ``attention``: the attention table (harness.bench.attention): TFLOP/s forward and forward + backward
  at the model's shapes, every method that provides attention (materialized and fused);
* ``launch``: host microseconds per call (harness.bench.launch);
* ``host-profile``: where those microseconds go at benchmark sizes (harness.bench.host_profile);
* ``overhead``: the harness vs a bare PyTorch loop (harness.bench.overhead);
* ``triton-sweep``, ``cuda-sweep``: the launch-table sweeps, which live with the kernels they tune
  (``kernels.methods.triton.sweep``, ``kernels.methods.cuda.sweep``).

On a CPU every table runs at tiny sizes with a wall-clock timer: the numbers mean nothing there; it
only checks the plumbing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v.strip()]


def _names(s: str) -> Optional[list[str]]:
    names = [m.strip() for m in s.split(",") if m.strip()]
    return names or None


def _shapes(p: argparse.ArgumentParser, flag: str, s: str, arity: int) -> list[tuple]:
    shapes = [tuple(_ints(c)) for c in s.split(";") if c.strip()]
    if any(len(c) != arity for c in shapes):
        p.error(f"{flag} takes shapes of {arity} integers separated by ';' (got {s!r})")
    return shapes


def _runnable(methods: Optional[list[str]], op: str) -> Optional[list[str]]:
    """The asked-for methods that can run here; the others are named with the reason and skipped."""
    import kernels

    if methods is None:
        return None
    avail = kernels.available_methods(include_timing_only=True)
    keep = []
    for m in methods:
        a = avail.get(m)
        if a is None:
            print(f"skipping {m}: unknown method (registered: {', '.join(sorted(avail))})")
        elif not a.available:
            print(f"skipping {m}: {a.reason}")
        elif op not in a.ops:
            print(f"skipping {m}: it does not provide {op} (it provides {', '.join(a.ops)})")
        else:
            keep.append(m)
    return keep


def main(argv: Optional[list[str]] = None) -> None:
    from harness.bench.softmax import DEFAULT_BASELINES, DEFAULT_SIZES

    p = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.split("\n\n")[0].replace("``", "`")
                                + " The tables (kernels, loss, attention, launch, host-profile) also run without a GPU, as a check: their times "
                                "are then the CPU's.")
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels", help="softmax GB/s vs N per method (eager and graph), with the copy ceiling")
    k.add_argument("--methods", default="", help="comma-separated methods (default: every softmax method here)")
    k.add_argument("--baselines", default=",".join(DEFAULT_BASELINES), help="ratios against these (default: %(default)s)")
    k.add_argument("--sizes", default=DEFAULT_SIZES, help="row lengths N (default: %(default)s)")
    k.add_argument("--elements", type=int, default=2**27, help="rows x N per measurement (default: 2^27)")
    k.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    k.add_argument("--fp32-sizes", default="1024,16384", help="extra fp32 row lengths ('' for none)")
    k.add_argument("--attention", default="8,12,1024,1024", help="B,H,T,T of the causal case ('' to skip)")
    k.add_argument("--rep-ms", type=int, default=100)
    k.add_argument("--out", default="outputs/bench", type=Path)
    ls = sub.add_parser("loss", help="cross-entropy ms vs V per method, fraction of the ideal, extra memory")
    ls.add_argument("--methods", default="", help="comma-separated methods (default: every cross-entropy method)")
    ls.add_argument("--vocabs", default="32768,50304,128256,262144")
    ls.add_argument("--tokens", type=int, default=16384)
    ls.add_argument("--linear", default="16384,768,50304", help="tokens,C,V of the linear cross-entropy ('' to skip)")
    ls.add_argument("--rep-ms", type=int, default=100)
    ls.add_argument("--out", default="outputs/bench", type=Path)
    at = sub.add_parser("attention", help="attention TFLOP/s per method, forward and forward + backward")
    at.add_argument("--methods", default="", help="comma-separated methods (default: every attention method)")
    at.add_argument("--shapes", default="16,12,1024,64;4,12,4096,64;1,12,16384,64;8,16,2048,128",
                    help="B,H,T,d shapes separated by ';'")
    at.add_argument("--layout", default="separate", choices=("separate", "qkv"),
                    help="separate: q, k, v and their three gradients; qkv: one projection output and its gradient, "
                    "as the model calls attention (a method's native attention_qkv, else its attention on split views)")
    at.add_argument("--rep-ms", type=int, default=100)
    at.add_argument("--out", default="outputs/bench", type=Path)
    la = sub.add_parser("launch", help="host microseconds per call, one-shot vs bound, every method")
    la.add_argument("--methods", default="", help="comma-separated methods (default: every method here)")
    la.add_argument("--calls", type=int, default=200)
    la.add_argument("--out", default="outputs/bench", type=Path)
    from harness.bench import host_profile

    hp = sub.add_parser("host-profile", help="host time per call at benchmark sizes, by event and thread (torch.profiler)")
    hp.add_argument("--op", default="attention", choices=host_profile.OPS)
    hp.add_argument("--methods", default="", help="comma-separated methods (default: every method that provides --op)")
    hp.add_argument("--shapes", default="", help="B,H,T,d (attention) or B,H,T,T (softmax) shapes separated by ';' "
                    f"(default: attention {host_profile.DEFAULT_SHAPES['attention']}; softmax "
                    f"{host_profile.DEFAULT_SHAPES['softmax']})")
    hp.add_argument("--calls", type=int, default=10, help="calls per timed run (default: %(default)s, as the issue time)")
    hp.add_argument("--top", type=int, default=12, help="events and Python functions listed per row")
    hp.add_argument("--out", default="outputs/bench", type=Path)
    o = sub.add_parser("overhead", help="harness tokens/s vs a bare PyTorch loop (torch method, or the overrides' "
                                         "accel and compile_model)")
    o.add_argument("overrides", nargs="*", default=[], help="Hydra overrides over model=gpt2s accel=torch")
    o.add_argument("--steps", type=int, default=30)
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--out", default="outputs/bench", type=Path)
    from kernels.methods.triton import sweep as triton_sweep  # (also python -m kernels.methods.triton.sweep)

    triton_sweep.add_arguments(sub.add_parser("triton-sweep", help="time candidate Triton launch settings per N (GPU only)"))
    c = sub.add_parser("cuda-sweep", help="time the CUDA kernels' launch variants per N (GPU + nvcc only)")
    c.add_argument("--sizes", default=DEFAULT_SIZES)
    c.add_argument("--elements", type=int, default=2**27)
    c.add_argument("--out", default="outputs/bench", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "kernels":
        from harness.bench.softmax import run_kernel_bench

        att = tuple(_ints(a.attention)) if a.attention else None
        run_kernel_bench(_runnable(_names(a.methods), "softmax"), _ints(a.sizes), a.elements, a.dtype,
                         _ints(a.fp32_sizes), att, a.out, a.rep_ms, tuple(_names(a.baselines) or ()))
    elif a.cmd == "loss":
        from harness.bench.loss import run_loss_bench

        lin = tuple(_ints(a.linear)) if a.linear else None
        run_loss_bench(_runnable(_names(a.methods), "cross_entropy"), _ints(a.vocabs), a.tokens, lin, a.out, a.rep_ms)
    elif a.cmd == "attention":
        from harness.bench.attention import run_attention_bench

        run_attention_bench(_runnable(_names(a.methods), "attention"), _shapes(p, "--shapes", a.shapes, 4), a.out,
                            a.rep_ms, a.layout)
    elif a.cmd == "launch":
        from harness.bench.launch import run_launch_bench

        run_launch_bench(_names(a.methods), a.out, a.calls)
    elif a.cmd == "host-profile":
        if a.calls < 1 or a.top < 1:
            p.error(f"--calls and --top take positive integers (got {a.calls} and {a.top})")
        shapes = _shapes(p, "--shapes", a.shapes or host_profile.DEFAULT_SHAPES[a.op], 4)
        host_profile.run_host_profile(_runnable(_names(a.methods), a.op), a.op, shapes, a.out, a.calls, a.top)
    elif a.cmd == "overhead":
        from harness.bench.overhead import run_overhead

        run_overhead(a.overrides, a.steps, a.rounds, a.out)
    elif a.cmd == "triton-sweep":
        triton_sweep.run_from_args(a, p.error)
    elif a.cmd == "cuda-sweep":
        from kernels.methods.cuda.sweep import run_cuda_sweep

        a.out.mkdir(parents=True, exist_ok=True)
        run_cuda_sweep(_ints(a.sizes), a.elements, a.out)


__all__ = ["main"]
