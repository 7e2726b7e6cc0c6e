"""Surviving long runs: graceful stops (SIGINT/SIGTERM) with a checkpoint, and non-finite loss detection.

Neither adds a host-device synchronization per step: the stop request is a flag checked on the host,
and the loss is checked for NaN/inf once per throughput window, where the monitor synchronizes anyway.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Callable, Optional

import torch
from lightning.pytorch import Callback
from rich.markup import escape

from harness.outcomes import NonFiniteLossError, StopNow


class GracefulStop(Callback):
    """SIGINT or SIGTERM, from ``install`` (before the run builds anything) to ``restore_handlers``.

    First signal: finish the current step, save ``checkpoints/last.ckpt``, stop without a validation
    pass (a signal before the first step: no step at all); the results say ``interrupted`` and
    ``resume=<run dir>`` continues. Second signal: :class:`StopNow` is raised where the run is (never
    in the middle of a checkpoint save: it waits for the save to end), and the run records itself as
    interrupted at the step it reached. Each signal is said on the console and in the run's log."""

    def __init__(self, ckpt_dir: Path, say: Callable[[str], None] = print):
        self.ckpt_dir = Path(ckpt_dir)
        self.say = say
        self.requested: Optional[str] = None
        self.at_once = False  # a second signal came
        self.stopped_at: Optional[int] = None
        self._saving = False
        self._pending = False  # a second signal that came during a save
        self._previous: dict = {}

    def install(self) -> None:
        """This callback's handlers for SIGINT and SIGTERM (again, over any set since: Lightning's own
        SIGTERM handler, set as fitting starts, would end the run with an exception, unrecorded)."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.at_once:
            return  # already stopping at once: the results are being written
        if self.requested:
            self.at_once = True
            self.say(f"harness: second {name} received: stopping now")
            if self._saving:
                self._pending = True
                return
            raise StopNow(name)
        self.requested = name
        self.say(f"harness: {name} received: stopping after this step and saving a checkpoint "
                 "(send it again to stop at once)")

    def on_train_start(self, trainer, pl_module) -> None:
        self.install()
        if self.requested:  # a signal while the run was built: no step
            self._stop(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.requested and not trainer.should_stop:
            self._stop(trainer)
            self.stopped_at = trainer.global_step
            self.save(trainer)

    def _stop(self, trainer) -> None:
        trainer.should_stop = True
        # Lightning validates when a run stops early; a stop asked for by a signal should be prompt
        trainer.limit_val_batches = 0

    def save(self, trainer) -> Path:
        path = self.ckpt_dir / "last.ckpt"
        self._saving = True
        try:
            # the full state (optimizer, loops, callbacks) a resume needs, said explicitly: left unset,
            # Lightning logs "`weights_only` was not set" on every graceful stop
            trainer.save_checkpoint(str(path), weights_only=False)
        finally:
            self._saving = False
        if self._pending:
            self._pending = False
            raise StopNow(self.requested)
        return path

    def restore_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def stopped_message(run_dir: Path, step: int, signal_name: str) -> str:
    """Where a run stopped by a signal stands, and the command that continues it (if a checkpoint can)."""
    if (Path(run_dir) / "checkpoints" / "last.ckpt").exists():
        return (f"[bold]harness[/]: stopped at step {step} ({signal_name}); continue with: "
                f"python -m harness.train resume={escape(str(run_dir))}")
    return (f"[bold]harness[/]: stopped at step {step} ({signal_name}) before any checkpoint was saved: nothing "
            "to resume; run the same command again")


class NonFiniteLossGuard(Callback):
    """Checks the losses of the last window for NaN/inf when the window closes. ``mode='stop'`` raises
    :class:`NonFiniteLossError`; ``mode='warn'`` prints once and records it (``self.event``)."""

    def __init__(self, window: int, method: str, mode: str = "stop"):
        if mode not in ("stop", "warn"):
            raise ValueError(f"trainer.on_nonfinite={mode!r} is not accepted: stop or warn")
        self.window, self.method, self.mode = window, method, mode
        self._checked = 0
        self.event: Optional[dict] = None

    def _check(self, pl_module) -> None:
        losses = pl_module._losses[self._checked :]
        steps = pl_module._loss_steps[self._checked :]
        if not losses or self.event is not None:
            return
        self._checked += len(losses)
        if bool(torch.isfinite(torch.stack(losses)).all()):  # one sync per window
            return
        values = [float(v) for v in torch.stack(losses).float().cpu()]
        bad = next(i for i, v in enumerate(values) if not torch.isfinite(torch.tensor(v)))
        curve = pl_module.loss_curve()
        finite = [(s, v) for s, v in curve if s < steps[bad] and v == v and abs(v) != float("inf")]
        last = finite[-1] if finite else (None, None)
        self.event = {"step": steps[bad], "value": values[bad], "method": self.method,
                      "last_finite_step": last[0], "last_finite_loss": last[1]}
        msg = (f"non-finite training loss ({values[bad]}) at step {steps[bad]} with method {self.method!r}; "
               f"last finite loss {last[1]} at step {last[0]}")
        if self.mode == "stop":
            raise NonFiniteLossError(msg + " (trainer.on_nonfinite=warn only warns)")
        print(f"harness: warning: {msg}; continuing (trainer.on_nonfinite=warn)", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.window == 0:
            self._check(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._check(pl_module)
