"""The Lightning side: a language-modelling task around a GPT, and the data module that feeds it."""

from __future__ import annotations

import math
from typing import Optional

import lightning as L
import torch
import torch.nn as nn

from harness.data import BatchStream, Corpus, loader


def make_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], fused: bool = True
) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only; fused on a GPU (unless fp16 needs a scaler)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused and bool(decay) and decay[0].is_cuda)


def clip_gradients(parameters, max_norm: float, optimizer: torch.optim.Optimizer) -> None:
    """Scale the gradients so that their total 2-norm is at most ``max_norm``, by clip_grad_norm_'s rule.

    A fused Adam(W) (without a gradient scaler) takes the factor as it reads each gradient: its
    ``grad_scale``, the tensor torch.amp.GradScaler hands it, divides every gradient in the optimizer's own
    pass (which then writes the gradients back, as clip_grad_norm_ leaves them). The clip so reads the
    gradients once for their norm and once less to scale them: in ``gpt2s`` 0.5 GB of fp32 gradients a step,
    outside any compiled graph. The factor holds for one step (``LanguageModelTask.on_before_zero_grad``
    removes it). Other optimizers: ``torch.nn.utils.clip_grad_norm_``. Rounding: a division by the factor's
    reciprocal, so a clipped step can differ from clip_grad_norm_'s in the last bit.
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return
    fused = bool(optimizer.defaults.get("fused")) and getattr(optimizer, "_step_supports_amp_scaling", False)
    if not fused:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    norm = torch.nn.utils.get_total_norm([p.grad for p in params]).float()  # (the fused kernels take fp32 only)
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)  # (1 / clip_grad_norm_'s factor)


def whole_model_compiled(model: nn.Module, compile_model: bool, compile_mode: str) -> tuple[nn.Module, bool]:
    """What a training step calls: the model, or with ``compile_model`` the whole model through torch.compile
    (after the method was applied, so a Triton/CUDA op sits inside the compiled graph); and whether the mode
    replays the step from CUDA graphs (reduce-overhead, max-autotune), whose outputs the next replay
    overwrites: such a loop marks each step (``torch.compiler.cudagraph_mark_step_begin``) and copies out
    what it keeps."""
    if not compile_model:
        return model, False
    return torch.compile(model, mode=compile_mode), compile_mode in ("reduce-overhead", "max-autotune")


def warmup_cosine_lr(step: int, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up, then cosine decay to min_ratio * lr. A pure function of the step, so a
    checkpoint taken anywhere resumes with the right learning rate (no scheduler state to lag)."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class LanguageModelTask(L.LightningModule):
    """Next-token prediction with AdamW, linear warm-up then cosine decay (``lr_at``).

    With ``compile_model`` the whole model runs through ``torch.compile`` (after the softmax method was
    applied, so a Triton/CUDA op sits inside the compiled graph). The per-step loss is kept on the
    device (no sync) and read once at the end: ``loss_curve()``.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        max_steps: int,
        lr_warmup_steps: int,
        min_lr_ratio: float,
        compile_model: bool = False,
        compile_mode: str = "default",
        grad_clip: float = 0.0,
        fused_optimizer: bool = True,
    ):
        super().__init__()
        self.model = model
        self.lr, self.weight_decay, self.betas = lr, weight_decay, betas
        self.max_steps, self.lr_warmup_steps, self.min_lr_ratio = max_steps, lr_warmup_steps, min_lr_ratio
        self.grad_clip, self.fused_optimizer = grad_clip, fused_optimizer
        # the compiled wrapper shares the model's parameters; kept out of the module tree so the
        # checkpoint holds one copy under the same names either way
        fwd, self._cudagraphs = whole_model_compiled(model, compile_model, compile_mode)
        object.__setattr__(self, "_forward_model", fwd)
        self._losses: list[torch.Tensor] = []
        self._loss_steps: list[int] = []
        self._earlier_curve: list[tuple[int, float]] = []  # from the checkpoint a resumed run started at
        self._first_batch_sum: Optional[torch.Tensor] = None

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        return self._forward_model(idx, targets)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self._first_batch_sum is None:
            self._first_batch_sum = x.sum()  # which data this rank saw (kept on device, read at the end)
        if self._cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        _, loss = self(x, y)
        # (no prog_bar=True: a device sync every step; see harness.progress)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        self._losses.append(loss.detach().clone() if self._cudagraphs else loss.detach())
        self._loss_steps.append(self.global_step)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self(x, y)
        self.log("val/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # clipping here rather than through Lightning, which refuses it for a fused optimizer even in
        # bf16 (no gradient scaler); with fp16 + scaler the optimizer is not fused and Lightning has
        # unscaled the gradients before this hook
        if self.grad_clip:
            clip_gradients(self.model.parameters(), self.grad_clip, getattr(optimizer, "optimizer", optimizer))

    def on_before_zero_grad(self, optimizer) -> None:
        # (runs after a step, before the next backward) the clip's factor was that step's alone
        getattr(optimizer, "optimizer", optimizer).__dict__.pop("grad_scale", None)

    def loss_curve(self) -> list[tuple[int, float]]:
        """(step, train loss) for every step of the run, earlier segments of a resumed run included;
        one device sync."""
        if not self._losses:
            return list(self._earlier_curve)
        values = torch.stack(self._losses).float().cpu().tolist()
        return self._earlier_curve + list(zip(self._loss_steps, values))

    def first_batch_checksums(self) -> list[int]:
        """Every rank's checksum of its first training batch (distinct ranks see distinct data)."""
        if self._first_batch_sum is None:
            return []
        t = self._first_batch_sum.detach().reshape(1)
        if self.trainer is not None and self.trainer.world_size > 1:
            t = self.all_gather(t)
        return [int(v) for v in t.flatten().cpu()]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        step = self.global_step
        checkpoint["harness_loss_curve"] = [(s, v) for s, v in self.loss_curve() if s < step]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._earlier_curve = [(int(s), float(v)) for s, v in checkpoint.get("harness_loss_curve", [])]

    def configure_optimizers(self):
        return make_optimizer(self.model, self.lr, self.weight_decay, self.betas, self.fused_optimizer)

    def lr_at(self, step: int) -> float:
        return warmup_cosine_lr(step, self.lr, self.lr_warmup_steps, self.max_steps, self.min_lr_ratio)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        lr = self.lr_at(self.global_step)
        for group in self.optimizers().param_groups:
            group["lr"] = lr


class TokenDataModule(L.LightningDataModule):
    """Train stream starting at the trainer's (possibly restored) global step; fixed validation set."""

    def __init__(
        self,
        corpus: Optional[Corpus],
        vocab_size: int,
        batch_size: int,
        seq_len: int,
        seed: int,
        max_steps: int,
        val_batches: int,
    ):
        super().__init__()
        self.corpus, self.vocab_size = corpus, vocab_size
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.max_steps, self.val_batches = max_steps, val_batches

    def _pin(self) -> bool:
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def _rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def train_dataloader(self):
        start = self.trainer.global_step if self.trainer is not None else 0
        tokens = None if self.corpus is None else self.corpus.train
        stream = BatchStream(
            tokens, self.vocab_size, self.batch_size, self.seq_len, self.seed, "train",
            start, self.max_steps, self._rank(),
        )
        return loader(stream, self._pin())

    def val_dataloader(self):
        tokens = None if self.corpus is None else self.corpus.val
        stream = BatchStream(
            tokens, self.vocab_size, self.batch_size, self.seq_len, self.seed, "val",
            0, self.val_batches, self._rank(),
        )
        return loader(stream, self._pin())
