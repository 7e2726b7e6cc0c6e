"""The parity probe (see harness.study.parity for the rule): fixed held-out batches and a Lightning
callback that evaluates the model on them before the first step and every few steps."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback

from harness.data import BatchStream


def probe_batches(corpus, vocab_size: int, batch_size: int, seq_len: int, seed: int, n: int) -> list:
    """``n`` fixed held-out batches: the validation split (random tokens for synthetic data), drawn
    from ``seed`` only, so every run of a study sees the same ones whatever its data order."""
    tokens = None if corpus is None else corpus.val
    stream = BatchStream(tokens, vocab_size, batch_size, seq_len, seed, "parity-probe", 0, n)
    return list(stream)


class ParityProbe(Callback):
    """Evaluates the model on the probe batches before the first step and every ``every`` global
    steps after (no gradients, the run's precision); ``curve`` holds (step, loss) once training ends.

    The eager model is probed even in a compiled run (it shares the compiled model's parameters and
    the method's ops): no second compilation for the no-gradient graph, and the trajectory the
    compiled training took is what the probe measures."""

    def __init__(self, batches: list, every: int):
        self.batches, self.every = batches, int(every)
        self._losses: list = []
        self._steps: list[int] = []
        self.curve: list[tuple[int, float]] = []

    def _probe(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if step % self.every or (self._steps and self._steps[-1] == step):
            return
        model = getattr(pl_module, "model", pl_module)
        was_training = model.training
        model.eval()
        total = None
        with torch.no_grad(), trainer.precision_plugin.forward_context():
            for x, y in self.batches:
                _, loss = model(x.to(pl_module.device, non_blocking=True), y.to(pl_module.device, non_blocking=True))
                total = loss.detach().float() if total is None else total + loss.detach().float()
        model.train(was_training)
        self._losses.append(total / len(self.batches))  # kept on the device: no sync inside the run
        self._steps.append(step)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._probe(trainer, pl_module)  # step 0: same initialization in every run, no data seen yet

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._probe(trainer, pl_module)  # after the throughput monitor closed its window (it runs first)

    def on_train_end(self, trainer, pl_module) -> None:
        self.collect()

    def collect(self) -> list[tuple[int, float]]:
        if self._losses:
            values = torch.stack(self._losses).cpu().tolist()
            self.curve = list(zip(self._steps, values))
        return self.curve
