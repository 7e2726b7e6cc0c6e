"""Benchmarks and tuning tools: ``python -m harness.bench <name>`` (or ``harness-bench``), every one from the
table :data:`BENCHMARKS` (name -> the module that defines its arguments and runs it).

Tables (one module each, in this package):

* ``kernels``: the softmax table (``softmax``): GB/s vs N, forward and backward, eager and graph replay,
  against the copy ceiling and the baselines, every softmax method by default;
* ``loss``: the cross-entropy table (``loss``): ms and fraction of the one-read-one-write ideal at
  V = 32768 .. 262144, extra memory, and the linear cross-entropy (no full logits); ``--models``: at
  model configs' vocabularies, hidden sizes and step tokens instead (``model_shapes``, ``loss_shapes``);
* ``attention``: the attention table (``attention``): TFLOP/s forward and forward + backward at
  (B, H, T, d) or grouped-query (B, H, Hkv, T, d) shapes, or ``--models``' (each config's heads, key/value
  heads, head size, context and batch), every method that provides attention (materialized and fused);
* ``launch``: host microseconds per call (``launch``);
* ``host-profile``: where those microseconds go at benchmark sizes (``host_profile``);
* ``overhead``: the harness vs a bare PyTorch loop (``overhead``).

Tuning tools (``harness/bench/tuning/``: how the kernels' launch tables were chosen): ``triton-sweep``,
``triton-ce-sweep``, ``cuda-sweep``, ``cuda-ce-sweep``, ``flash-sweep``, ``flash-compile-check``.

On a CPU every table runs at tiny sizes with a wall-clock timer: the numbers mean nothing there; it
only checks the plumbing.

A benchmark module has ``add_arguments(parser)`` and ``run(args, error)`` (``error``: its parser's, for an
argument it rejects). Adding one is a module and a row in :data:`BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple, Optional


class Benchmark(NamedTuple):
    """One command of ``python -m harness.bench``: the module that defines and runs it, and its help line."""

    module: str
    help: str


#: Every benchmark and tuning tool by command name, in the order ``--help`` lists them.
BENCHMARKS: dict[str, Benchmark] = {
    "kernels": Benchmark("harness.bench.softmax",
                         "softmax GB/s vs N per method (eager and graph), with the copy ceiling"),
    "loss": Benchmark("harness.bench.loss", "cross-entropy ms vs V per method, fraction of the ideal, extra memory"),
    "attention": Benchmark("harness.bench.attention", "attention TFLOP/s per method, forward and forward + backward"),
    "launch": Benchmark("harness.bench.launch", "host microseconds per call, one-shot vs bound, every method"),
    "host-profile": Benchmark("harness.bench.host_profile",
                              "host time per call at benchmark sizes, by event and thread (torch.profiler)"),
    "overhead": Benchmark("harness.bench.overhead", "harness tokens/s vs a bare PyTorch loop (torch method, or the "
                                                    "overrides' accel and compile_model)"),
    "triton-sweep": Benchmark("harness.bench.tuning.triton_sweep",
                              "time candidate Triton softmax launch settings per N (GPU only)"),
    "triton-ce-sweep": Benchmark("harness.bench.tuning.triton_ce_sweep",
                                 "time the Triton cross-entropy's candidate plans per V (GPU only)"),
    "cuda-sweep": Benchmark("harness.bench.tuning.cuda_sweep",
                            "time the CUDA kernels' launch variants per N (GPU + nvcc only)"),
    "cuda-ce-sweep": Benchmark("harness.bench.tuning.cuda_ce_sweep",
                               "time the CUDA cross-entropy's launch variants per V (GPU + nvcc only)"),
    "flash-sweep": Benchmark("harness.bench.tuning.flash_sweep",
                             "time the flash attention's launch plans per shape, phase by phase (GPU)"),
    "flash-compile-check": Benchmark("harness.bench.tuning.flash_compile_check",
                                     "compile the flash kernels of a plan for a GPU target, no GPU needed "
                                     "(registers, spills, shared memory)"),
}


DESCRIPTION = ("Benchmarks (kernels, loss, attention, launch, host-profile, overhead) and the tuning tools (the "
               "launch-table sweeps, the flash compile check). The tables also run without a GPU, as a check: their "
               "times are then the CPU's.")


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m harness.bench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="<name>")
    chosen = argv[0] if argv and argv[0] in BENCHMARKS else None
    module = None
    for name, bench in BENCHMARKS.items():
        sp = sub.add_parser(name, help=bench.help, description=bench.help)
        if name == chosen:
            # only the chosen command's module is imported: each imports its kernels (and the compile check
            # must run without TRITON_INTERPRET), so --help and the other commands need none of them
            module = importlib.import_module(bench.module)
            module.add_arguments(sp)
    a = p.parse_args(argv)
    module.run(a, sub.choices[a.cmd].error)


__all__ = ["BENCHMARKS", "Benchmark", "main"]
