"""Throughput measurement that does not perturb what it measures.

Steps are timed in windows of ``window`` steps. The device is synchronized only where a window opens
after a pause (validation, checkpointing) and where it closes; inside a window the host never waits
for the GPU. Per-step times come from CUDA events recorded at each step start (no sync) and read when
the window closes. The first ``warmup_steps`` steps (compilation, autotuning, allocator warm-up) are
timed apart and reported as ``warmup_s``; they are never part of a throughput figure.

Logged under ``train/`` (from rank 0): ``tokens_per_s`` (global: the sum of every rank's own figure,
gathered once per window), ``tokens_per_s_per_device``, ``samples_per_s``, ``step_ms``, ``mfu`` (per
device, against the dense bf16 peak of the GPU, see :data:`PEAK_BF16_FLOPS`), ``peak_mem_gib``, and
``warmup_s`` once.

A run is flagged **noisy** when its step times spread: p90 / p50 above :data:`NOISY_SPREAD` (1.10)
(``step_ms_spread`` and ``noisy`` in the summary and results.json), a sign that something else ran
on the machine or the clocks moved; its throughput is still reported, with the flag beside it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from lightning.pytorch import Callback

from harness.outcomes import NOISY_SPREAD


#: Dense (no sparsity) bf16 tensor-core peak FLOP/s by device-name fragment, first match wins.
#: Datasheet figures; H200 SXM has the H100 SXM's compute (989.4 TFLOP/s).
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),
    ("H800", 989.4e12),
    ("H20", 148.0e12),
    ("B200", 2250e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.0e12),
    ("L4", 121.0e12),
    ("A10G", 70.0e12),
    ("A10", 125.0e12),
    ("RTX 4090", 165.2e12),
    ("RTX 3090", 71.0e12),
    ("V100", 125.0e12),  # fp16 (no bf16 on Volta)
]


def peak_bf16_flops(device_name: Optional[str]) -> Optional[float]:
    """Dense bf16 peak for a device name such as 'NVIDIA H200' or 'NVIDIA H100 80GB HBM3'; None if unknown."""
    if not device_name:
        return None
    for fragment, flops in PEAK_BF16_FLOPS:
        if fragment.lower() in device_name.lower():
            return flops
    return None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(p50: Optional[float], p90: Optional[float]) -> tuple[Optional[float], Optional[bool]]:
    """(p90 / p50, whether that exceeds NOISY_SPREAD); (None, None) without both figures."""
    if not p50 or p90 is None or p50 <= 0:
        return None, None
    s = p90 / p50
    return s, s > NOISY_SPREAD


@dataclass
class ThroughputSummary:
    tokens_per_s: Optional[float] = None  # median over windows, global (summed over ranks)
    tokens_per_s_per_device: Optional[float] = None
    samples_per_s: Optional[float] = None
    step_ms_p50: Optional[float] = None
    step_ms_p90: Optional[float] = None
    step_ms_mean: Optional[float] = None
    step_ms_spread: Optional[float] = None  # p90 / p50 of the step times
    noisy: Optional[bool] = None  # step_ms_spread > NOISY_SPREAD
    mfu: Optional[float] = None
    peak_mem_gib: Optional[float] = None
    warmup_s: Optional[float] = None
    measured_steps: int = 0
    windows: int = 0
    window_tokens_per_s: list[float] = field(default_factory=list)
    segment_warmups_s: list[float] = field(default_factory=list)  # one per process segment (resumes)
    window_rank_tokens_per_s: list = field(default_factory=list)  # each window: every rank's own figure

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ThroughputMonitor(Callback):
    def __init__(
        self,
        tokens_per_step: int,
        samples_per_step: int,
        flops_per_token: float,
        warmup_steps: int,
        window: int,
        peak_flops: Optional[float],
    ):
        self.tokens_per_step = tokens_per_step  # per rank
        self.samples_per_step = samples_per_step  # per rank
        self.flops_per_token = flops_per_token
        self.warmup_steps = warmup_steps
        self.window = window
        self.peak_flops = peak_flops  # per device
        self.world_size = 1
        self._gather = None  # all_gather of the per-rank figures (distributed runs)
        self._cuda = False
        self._start_time: Optional[float] = None
        self._win_t0: Optional[float] = None
        self._win_steps = 0
        self._events: list = []
        self._host_step_t: list[float] = []
        self.step_ms: list[float] = []
        self.window_tps: list[float] = []
        self.window_steps: list[int] = []
        self.window_rank_tps: list[list[float]] = []
        self.earlier_warmups_s: list[float] = []  # warm-ups of earlier segments of a resumed run
        self.warmup_s: Optional[float] = None
        self._steps_seen = 0

    # -- helpers ---------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    def _open(self) -> None:
        self._sync()  # work queued before the window (validation, warm-up) must not count
        self._win_t0 = time.perf_counter()
        self._win_steps = 0
        self._events = []
        self._host_step_t = []

    def _finish_window(self) -> Optional[float]:
        """Close the open window: sync, collect per-step times; returns its wall seconds (None if empty)."""
        if self._win_t0 is None or self._win_steps == 0:
            self._win_t0 = None
            return None
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        self._sync()
        elapsed = time.perf_counter() - self._win_t0
        if self._cuda:
            marks = self._events + [end]
            self.step_ms += [a.elapsed_time(b) for a, b in zip(marks[:-1], marks[1:])]
        else:
            marks = self._host_step_t + [time.perf_counter()]
            self.step_ms += [1000.0 * (b - a) for a, b in zip(marks[:-1], marks[1:])]
        local = self._win_steps * self.tokens_per_step / elapsed
        per_rank = [local]
        if self.world_size > 1 and self._gather is not None:
            # every rank closes the same windows (same global steps): one collective per window
            per_rank = [float(v) for v in self._gather(torch.tensor([local], dtype=torch.float64)).flatten()]
        self.window_rank_tps.append(per_rank)
        self.window_tps.append(sum(per_rank))  # global = the sum of the ranks' own figures
        self.window_steps.append(self._win_steps)
        self._win_t0 = None
        return elapsed

    def _close(self, pl_module) -> None:
        steps = self._win_steps
        elapsed = self._finish_window()
        if elapsed is None:
            return
        tps = self.window_tps[-1]
        per_device = tps / len(self.window_rank_tps[-1])
        metrics = {
            "train/tokens_per_s": tps,  # global: summed over ranks
            "train/tokens_per_s_per_device": per_device,
            "train/samples_per_s": tps * self.samples_per_step / self.tokens_per_step,
            "train/step_ms": 1000.0 * elapsed / steps,
        }
        if self.peak_flops:
            metrics["train/mfu"] = per_device * self.flops_per_token / self.peak_flops  # per device
        if self._cuda:
            metrics["train/peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        for k, v in metrics.items():
            pl_module.log(k, v, rank_zero_only=True)  # (no prog_bar=True: see harness.progress)

    # -- Lightning hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self._cuda = pl_module.device.type == "cuda"
        self.world_size = trainer.world_size
        if self.world_size > 1:
            self._gather = lambda t: pl_module.all_gather(t.to(pl_module.device)).cpu()
        self._sync()
        self._start_time = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._steps_seen >= self.warmup_steps:
            if self._win_t0 is None:
                self._open()
            if self._cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self._events.append(ev)
            else:
                self._host_step_t.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps_seen += 1
        if self._steps_seen == self.warmup_steps:
            self._sync()
            self.warmup_s = time.perf_counter() - self._start_time
            pl_module.log("train/warmup_s", self.warmup_s, rank_zero_only=True)
            return
        if self._win_t0 is not None:
            self._win_steps += 1
            # windows end on multiples of `window` global steps, where validation and checkpoints
            # happen (their interval is a multiple of it), so those never fall inside a window
            if trainer.global_step % self.window == 0:
                self._close(pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        # validation must not fall inside a window; windows normally close just before it (val_every
        # is a multiple of the window), this closes a partial one without logging it
        if trainer.state.fn == "fit" and self._win_t0 is not None:
            self._finish_window()

    def on_train_end(self, trainer, pl_module) -> None:
        # a last partial window counts only if it is at least half a window long (Lightning no longer
        # accepts self.log here, so it goes to the summary alone)
        if self._win_t0 is not None and self._win_steps >= max(1, self.window // 2):
            self._finish_window()
        self._win_t0 = None

    # -- checkpointed state: a resumed run reports over the whole run -----------------------------
    def state_dict(self) -> dict:
        return {"step_ms": self.step_ms, "window_tps": self.window_tps, "window_steps": self.window_steps,
                "window_rank_tps": self.window_rank_tps,
                "warmups_s": self.earlier_warmups_s + ([self.warmup_s] if self.warmup_s is not None else [])}

    def load_state_dict(self, state: dict) -> None:
        self.step_ms = list(state.get("step_ms", [])) + self.step_ms
        self.window_tps = list(state.get("window_tps", [])) + self.window_tps
        self.window_steps = list(state.get("window_steps", [])) + self.window_steps
        self.window_rank_tps = list(state.get("window_rank_tps", [])) + self.window_rank_tps
        self.earlier_warmups_s = list(state.get("warmups_s", []))

    # -- results ---------------------------------------------------------------------------------
    def summary(self) -> ThroughputSummary:
        warmups = self.earlier_warmups_s + ([self.warmup_s] if self.warmup_s is not None else [])
        s = ThroughputSummary(warmup_s=sum(warmups) if warmups else None, windows=len(self.window_tps))
        s.segment_warmups_s = warmups
        s.window_tokens_per_s = list(self.window_tps)
        s.measured_steps = len(self.step_ms)
        # the median is over windows of at least half the nominal length (the first window after the
        # warm-up can be a short one); their per-step times still count in the percentiles
        full = [t for t, n in zip(self.window_tps, self.window_steps) if n >= max(1, self.window // 2)]
        if full or self.window_tps:
            tps = statistics.median(full or self.window_tps)
            s.tokens_per_s = tps
            s.tokens_per_s_per_device = tps / max(1, self.world_size)
            s.samples_per_s = tps * self.samples_per_step / self.tokens_per_step
            if self.peak_flops:
                s.mfu = tps / max(1, self.world_size) * self.flops_per_token / self.peak_flops
        s.window_rank_tokens_per_s = [list(r) for r in self.window_rank_tps]
        if self.step_ms:
            s.step_ms_p50 = percentile(self.step_ms, 50)
            s.step_ms_p90 = percentile(self.step_ms, 90)
            s.step_ms_mean = statistics.fmean(self.step_ms)
            s.step_ms_spread, s.noisy = spread(s.step_ms_p50, s.step_ms_p90)
        if self._cuda:
            s.peak_mem_gib = torch.cuda.max_memory_allocated() / 2**30
        return s
