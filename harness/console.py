"""What a run prints besides its progress (harness.progress): its own lines, the end-of-run lines, and no
third-party noise the user cannot act on.

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
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from harness.outcomes import NOISY_SPREAD

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
        # the log file first: what the user has seen is already in it (a second Ctrl+C, sent on seeing the
        # first one's line, stops the run at once, possibly before this method returns)
        if not self.quiet and self._log_files:
            text = " ".join(Text.from_markup(o).plain if isinstance(o, str) else str(o) for o in objects)
            record = logging.LogRecord("harness", logging.INFO, __file__, 0, text, None, None)
            for handler in self._log_files:
                handler.handle(record)
        super().print(*objects, **kwargs)


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
