"""Surviving long runs: graceful stops (SIGINT/SIGTERM) with a checkpoint, and non-finite loss detection.

Neither adds a host-device synchronization per step: the stop request is a flag checked on the host,
and the loss is checked for NaN/inf once per throughput window, where the monitor synchronizes anyway.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch import Callback


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (the message names the step, method, last finite loss)."""


class GracefulStop(Callback):
    """First SIGINT or SIGTERM: finish the current step, save ``checkpoints/last.ckpt``, stop cleanly
    (the results say ``interrupted``; ``resume=<run dir>`` continues). A second signal acts as usual."""

    def __init__(self, ckpt_dir: Path):
        self.ckpt_dir = Path(ckpt_dir)
        self.requested: Optional[str] = None
        self.stopped_at: Optional[int] = None
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested:  # second signal: restore the default behaviour and re-deliver
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.requested = name
        print(f"\nharness: {name} received: stopping after this step and saving a checkpoint "
              "(send it again to stop at once)", flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.requested and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped_at = trainer.global_step
            self.save(trainer)

    def save(self, trainer) -> Path:
        path = self.ckpt_dir / "last.ckpt"
        # the full state (optimizer, loops, callbacks) a resume needs, said explicitly: left unset, Lightning
        # logs "`weights_only` was not set" on every graceful stop
        trainer.save_checkpoint(str(path), weights_only=False)
        return path

    def restore_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def on_train_end(self, trainer, pl_module) -> None:
        self.restore_handlers()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.restore_handlers()


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
