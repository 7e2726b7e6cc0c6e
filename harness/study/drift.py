"""Whether the machine's speed changed while a study ran: a speedup compares runs made at different
times, and a machine that is uniformly slower for one run than for the next (other work on its cores,
a GPU that clocked down) invents one that no step-time spread within a run can see.

Every study run is bracketed by a calibration: a fixed workload (a square matmul and a GELU of the
device's :data:`CALIBRATION` size and dtype), timed CALIBRATION_REPS times after CALIBRATION_WARMUP
calls, the median in ms, on the run's device, just before and just after the run (about 2 ms on an
H100, under a millisecond on a CPU). On a GPU the workload must be long against a launch: a 256-square matmul
(0.04 ms) timed the host's launch latency and an idle GPU's clock ramp, and read 2x apart between
runs on a quiet H100. A point's
drift is its slowest calibration over its fastest; above DRIFT_LIMIT every comparison at the point
(speedups, ratios) is marked UNTRUSTED (harness.study.judge). The limit is that of a noisy run's step
spread (harness.outcomes.NOISY_SPREAD): a machine whose speed changed by more than 10% cannot
support a comparison finer than that. The calibrations are kept in ``parity_probe.json`` beside each
run, so the report over a runs folder (harness.report) judges them the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch
from omegaconf import DictConfig

from harness.build import gpu_here
from harness.outcomes import NOISY_SPREAD

#: the largest slowest/fastest calibration ratio at which a point's comparisons are trusted
DRIFT_LIMIT = NOISY_SPREAD
#: device type -> (size, dtype) of the calibration's matmul: compute-bound where it runs (bf16 on a GPU: 1.1
#: TFLOP, some 2 ms on an H100, whatever the float32 matmul precision a run set)
CALIBRATION = {"cpu": (256, torch.float32), "cuda": (8192, torch.bfloat16)}
CALIBRATION_REPS = 5
CALIBRATION_WARMUP = 3  # (the first pays for allocation and kernel choice; the next let a GPU's clock ramp up)


def calibration_device(cfg: DictConfig) -> str:
    """The device the study's runs train on: CUDA where the trainer may use it and there is one."""
    return "cuda" if gpu_here(cfg) else "cpu"


def calibrate(device: str = "cpu", clock: Optional[Callable[[], float]] = None,
              reps: int = CALIBRATION_REPS) -> Optional[float]:
    """The median ms of the calibration workload on ``device`` (``clock``: seconds, default
    time.perf_counter; read after a device sync); None where the GPU has no room for it (some 400 MiB: a
    run that filled it must not fail the study here). Its memory is handed back to the GPU afterwards, so
    the next run's memory check sees what it saw before."""
    clock = clock or time.perf_counter
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    size, dtype = CALIBRATION["cuda" if cuda else "cpu"]
    try:
        a = torch.randn(size, size, generator=torch.Generator(device=device).manual_seed(0), device=device,
                        dtype=dtype)
        for _ in range(CALIBRATION_WARMUP):
            torch.nn.functional.gelu(a @ a)
        sync()
        times = []
        for _ in range(reps):
            t0 = clock()
            torch.nn.functional.gelu(a @ a)
            sync()
            times.append((clock() - t0) * 1e3)
    except torch.OutOfMemoryError:
        return None
    finally:
        a = None
        if cuda:
            torch.cuda.empty_cache()
    return statistics.median(times)


def drift_of(rows: list) -> Optional[dict]:
    """The machine's speed over the runs of ``rows`` (one point): {"fastest_ms", "slowest_ms", "drift",
    "untrusted"}; None where fewer than two calibrations were recorded."""
    values = [c for r in rows for run in r.runs for c in (run.get("calibration_ms") or []) if c and c > 0]
    if len(values) < 2:
        return None
    fastest, slowest = min(values), max(values)
    drift = slowest / fastest
    return {"fastest_ms": fastest, "slowest_ms": slowest, "drift": drift, "untrusted": drift > DRIFT_LIMIT}


def drift_sentence(info: Optional[dict]) -> str:
    """The report's line on a point's drift ('' where nothing was calibrated)."""
    if not info:
        return ""
    span = (f"Machine speed: the calibration took {info['fastest_ms']:.2f} to {info['slowest_ms']:.2f} ms "
            f"over this point's runs ({info['drift']:.2f}x")
    if info["untrusted"]:
        return (f"**{span}, beyond {DRIFT_LIMIT:.2f}x): the machine's speed changed between runs, so every "
                "comparison here is UNTRUSTED** (docs/studies.md, drift).")
    return f"{span}, within {DRIFT_LIMIT:.2f}x)."
