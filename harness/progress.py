"""A run's progress: the numbers people read (tokens/s as 882k, step time, MFU in percent, the loss) every
``trainer.window`` steps, as a live bar on a terminal and as plain lines anywhere else (a pipe, a log file,
CI), where a bar's carriage returns and cursor moves would leave ``\\r`` runs and ``ESC[A`` fragments.

Both read ``trainer.callback_metrics`` when they refresh, so the harness logs nothing with
``prog_bar=True``: Lightning converts such metrics to Python numbers after every batch, whether a bar shows
them or not, a host-device synchronization each step (Lightning-AI/pytorch-lightning#21232).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar


def human(value: float) -> str:
    """882k, 1.23M, 950: a rate at a glance."""
    v = abs(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            q = value / scale
            return f"{q:.3g}{suffix}" if abs(q) < 100 else f"{q:.0f}{suffix}"
    return f"{value:.3g}" if v < 100 else f"{value:.0f}"


def step_time(ms: float) -> str:
    return f"{ms / 1000:.2f}s" if ms >= 1000 else f"{ms:.3g}ms" if ms < 100 else f"{ms:.0f}ms"


def _value(metrics: dict, key: str) -> Optional[float]:
    v = metrics.get(key)
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def bar_metrics(metrics: dict) -> dict[str, Any]:
    """The progress figures from the logged metrics: loss, val_loss, tok/s, step, mfu."""
    out: dict[str, Any] = {}
    for key, label in (("train/loss", "loss"), ("val/loss", "val_loss")):
        v = _value(metrics, key)
        if v is not None:
            out[label] = f"{v:.3f}"
    v = _value(metrics, "train/tokens_per_s")
    if v is not None:
        out["tok/s"] = human(v)
    v = _value(metrics, "train/step_ms")
    if v is not None:
        out["step"] = step_time(v)
    v = _value(metrics, "train/mfu")
    if v is not None:
        out["mfu"] = f"{100 * v:.1f}%"
    return out


def without_loss(shown: dict[str, Any]) -> dict[str, Any]:
    """The figures for a timing-only method (registered exact=False, e.g. ``floor``): what it logs as a loss
    is no loss (the floor reads the logits once and returns a stand-in), so "-" is shown instead."""
    return {k: ("-" if k in ("loss", "val_loss") else v) for k, v in shown.items()}


def _shown(trainer, loss_computed: bool) -> dict[str, Any]:
    shown = bar_metrics(dict(trainer.callback_metrics))
    return shown if loss_computed else without_loss(shown)


class HarnessProgressBar(TQDMProgressBar):
    """Lightning's bar without ``v_num``, with readable figures, counting optimizer steps up to
    ``trainer.max_steps`` (the data stream is unsized, so Lightning alone shows ``20/?``); a resumed run's bar
    starts at the step it resumed from."""

    def __init__(self, refresh_rate: int = 1, loss_computed: bool = True, **kwargs: Any):
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.loss_computed = loss_computed

    def on_train_epoch_start(self, trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        if trainer.max_steps and trainer.max_steps > 0:  # (Lightning's total: the steps left, or None)
            bar = self.train_progress_bar
            bar.total = trainer.max_steps
            bar.initial = bar.n = trainer.global_step  # (tqdm's count of work done before this start)
            if not bar.disable:
                bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        # counted in optimizer steps, whatever index a resumed epoch gives its batches
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        return _shown(trainer, self.loss_computed)


class LineProgress(ProgressBar):
    """The progress as plain lines (``step 20/40  loss 3.142  tok/s 882k  step 45.2ms  mfu 31.2%``), one
    every ``refresh_rate`` steps and one after each validation, for output that is not a terminal."""

    def __init__(self, refresh_rate: int = 1, loss_computed: bool = True, stream: Optional[TextIO] = None):
        super().__init__()
        self.refresh_rate = max(1, int(refresh_rate))
        self.loss_computed = loss_computed
        self.stream = stream
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _write(self, line: str) -> None:
        if self._enabled and self.trainer.is_global_zero:
            out = self.stream or sys.stderr
            print(line, file=out, flush=True)

    def _figures(self, trainer) -> str:
        return "  ".join(f"{k} {v}" for k, v in _shown(trainer, self.loss_computed).items())

    def on_train_batch_end(self, trainer, *args: Any) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if step % self.refresh_rate == 0 or step == total:
            of = f"/{total}" if total and total > 0 else ""
            self._write(f"step {step}{of}  {self._figures(trainer)}".rstrip())

    def on_validation_end(self, trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            shown = _shown(trainer, self.loss_computed)
            if "val_loss" in shown:
                self._write(f"validation at step {trainer.global_step}: val_loss {shown['val_loss']}")


def progress_callback(refresh_rate: int, loss_computed: bool = True, stream: Optional[TextIO] = None) -> ProgressBar:
    """The bar on a terminal (``stream``, standard error by default, is one), plain lines otherwise."""
    out = stream or sys.stderr
    interactive = hasattr(out, "isatty") and out.isatty()
    if interactive:
        return HarnessProgressBar(refresh_rate=refresh_rate, loss_computed=loss_computed)
    return LineProgress(refresh_rate=refresh_rate, loss_computed=loss_computed, stream=stream)
