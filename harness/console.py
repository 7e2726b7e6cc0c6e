"""What a run prints: a progress bar with the numbers people read (tokens/s as 882k, step time, MFU in
percent, the loss), and no third-party noise the user cannot act on.

The filters are targeted: one Lightning deprecation warning that Lightning itself triggers, Lightning's
advertising tips, its TPU/HPU lines and its note on the limit_val_batches the harness sets, W&B's
warning about a setting Lightning passes, and, when a run resumes, Lightning's warning that its
checkpoint directory is not empty. Every other warning and log
line still shows.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Optional

from lightning.pytorch.callbacks import TQDMProgressBar
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from harness.throughput import NOISY_SPREAD

#: Lightning's INFO lines (logger lightning.pytorch.utilities.rank_zero) that say nothing about this run
#: (limit_val_batches: the harness sets it on purpose, from trainer.val_batches, on every run)
_LIGHTNING_NOISE = ("💡 Tip:", "TPU available:", "HPU available:", "`Trainer(limit_val_batches=")


class _DropLines(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


_FILTER = _DropLines(_LIGHTNING_NOISE)


class RunConsole(Console):
    """The harness's own lines: Rich on stderr, never wrapped mid-phrase when stderr is a pipe or a file
    (soft wrap: the terminal wraps, if anything), and each one also written as plain text to the run's
    log file (the root logger's file handler: Hydra's train.log), so the log holds the checks, the
    method and where the results went, not only Lightning's lines."""

    def __init__(self, **kwargs: Any):
        super().__init__(stderr=True, soft_wrap=True, **kwargs)
        self._log_files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 (Console's own name)
        super().print(*objects, **kwargs)
        if self.quiet or not self._log_files:
            return
        text = " ".join(Text.from_markup(o).plain if isinstance(o, str) else str(o) for o in objects)
        record = logging.LogRecord("harness", logging.INFO, __file__, 0, text, None, None)
        for handler in self._log_files:
            handler.handle(record)


def quiet_third_party(resuming: bool = False) -> None:
    """Silence the third-party messages a harness user cannot act on (idempotent). ``resuming``: also
    Lightning's warning that the checkpoint directory is not empty (a resumed run's own checkpoints)."""
    # lightning's own _pytree builds a torch LeafSpec, which torch >= 2.9 deprecates (FutureWarning)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    if resuming:
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


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
    """The progress bar's postfix from the logged metrics: loss, val_loss, tok/s, step, mfu."""
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


class HarnessProgressBar(TQDMProgressBar):
    """Lightning's bar without ``v_num``, with readable throughput figures. It reads
    ``trainer.callback_metrics`` when it refreshes (every ``refresh_rate`` steps), so the harness logs nothing
    with ``prog_bar=True``: Lightning converts such metrics to Python numbers after every batch, whether a bar
    shows them or not, a host-device synchronization each step (Lightning-AI/pytorch-lightning#21232)."""

    def __init__(self, refresh_rate: int = 1, loss_computed: bool = True, **kwargs: Any):
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.loss_computed = loss_computed

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        shown = bar_metrics(dict(trainer.callback_metrics))
        return shown if self.loss_computed else without_loss(shown)


def without_loss(shown: dict[str, Any]) -> dict[str, Any]:
    """The bar's figures for a timing-only method (registered exact=False, e.g. ``floor``): what it logs as
    a loss is no loss (the floor reads the logits once and returns a stand-in), so "-" is shown instead."""
    return {k: ("-" if k in ("loss", "val_loss") else v) for k, v in shown.items()}


def done_message(results: dict, label: str, device: str, summary, run_dir: Path, logger_name: str) -> str:
    """The end-of-run lines: the throughput, the final loss, where the results are and how to see the
    metrics (the offline W&B run's ``wandb sync`` command, or the CSV file)."""
    tps = f"{summary.tokens_per_s:,.0f}" if summary.tokens_per_s else "n/a"
    windows = f"{summary.windows} window" + ("" if summary.windows == 1 else "s")
    loss = results.get("final_train_loss")
    loss_text = f"{loss:.4f}" if isinstance(loss, float) else str(loss)
    if results.get("exact") is False:  # a timing-only method computes no loss
        loss_text = "n/a (timing only)"
    noisy = (f", NOISY: step p90/p50 {summary.step_ms_spread:.2f} > {NOISY_SPREAD:.2f}, something else ran on the "
             "machine or the clocks moved" if getattr(summary, "noisy", False) else "")
    lines = [f"[bold]harness[/]: done: accel={escape(label)} on {escape(device)}: {tps} tokens/s (median of "
             f"{windows}{noisy}), warm-up {summary.warmup_s or 0:.1f}s, final loss {loss_text}",
             f"  results: {escape(str(run_dir / 'results.json'))}"]
    trainer = (results.get("config") or {}).get("trainer") or {}
    if not summary.tokens_per_s and not results.get("stopped_by") and {"warmup_steps", "window"} <= set(trainer):
        need = max(1, trainer["window"] // 2)  # (throughput.py: a last window of fewer steps is not counted)
        lines.insert(1, f"  no throughput: {results.get('steps_done', '?')} steps, the first {trainer['warmup_steps']} "
                        f"of them warm-up, and a window counts from {need} timed steps (trainer.window="
                        f"{trainer['window']}): run trainer.max_steps >= {trainer['warmup_steps'] + need}")
    wb = results.get("wandb") or {}
    if logger_name == "wandb" and wb:
        runs = sorted(Path(run_dir, "wandb").glob(f"offline-run-*-{wb.get('id')}")) if wb.get("mode") == "offline" else []
        if runs:
            lines.append(f"  W&B (offline): upload with `wandb sync {escape(' '.join(str(r) for r in runs))}`, "
                         f"or look at it here with `wandb leet {escape(str(runs[-1]))}`")
        elif wb.get("mode") == "online":
            lines.append(f"  W&B: run {wb.get('id')} in project {results['config']['logger']['project']}")
    elif logger_name == "csv":
        lines.append(f"  metrics: {escape(str(run_dir / 'csv' / 'metrics.csv'))}")
    return "\n".join(lines)
