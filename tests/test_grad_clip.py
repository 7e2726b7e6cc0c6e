"""Gradient clipping (harness.task.clip_gradients): clip_grad_norm_'s rule, inside a fused AdamW's own pass
(its grad_scale) where the optimizer is one, through the task's hook as Lightning calls it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from harness.task import LanguageModelTask, clip_gradients


def _params_and_grads(scale: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = [nn.Parameter(torch.randn(300, generator=g)), nn.Parameter(torch.randn(20, 7, generator=g))]
    grads = [torch.randn(p.shape, generator=g) * scale for p in params]
    return params, grads


def _step(clip, fused: bool, scale: float, max_norm: float = 1.0):
    params, grads = _params_and_grads(scale)
    opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.1, fused=fused)
    for _ in range(2):  # (the second step: a stale grad_scale must not carry over)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        clip(params, max_norm, opt)
        opt.step()
        grads = [g * 0.01 for g in grads]  # small: no clipping on the second step
    return [p.detach() for p in params], [p.grad for p in params]


def _reference(params, max_norm, opt):
    torch.nn.utils.clip_grad_norm_(params, max_norm)


@pytest.mark.parametrize("scale", [10.0, 0.001], ids=["clipped", "under-the-norm"])
def test_fused_adamw_clips_in_its_own_pass_as_clip_grad_norm_does(scale):
    want, want_grads = _step(_reference, fused=True, scale=scale)
    got, got_grads = _step(clip_gradients, fused=True, scale=scale)
    for a, b in zip(got + got_grads, want + want_grads):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_other_optimizers_take_clip_grad_norm_():
    want, _ = _step(_reference, fused=False, scale=10.0)
    got, _ = _step(clip_gradients, fused=False, scale=10.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    params, _ = _params_and_grads(1.0)
    opt = torch.optim.AdamW(params, fused=False)
    clip_gradients(params, 1.0, opt)  # no gradient yet: nothing to do
    assert getattr(opt, "grad_scale", None) is None


def test_the_task_hook_reaches_the_optimizer_behind_lightnings_wrapper():
    from lightning.pytorch.core.optimizer import LightningOptimizer

    model = nn.Linear(8, 8, bias=False)
    task = LanguageModelTask(model, 0.1, 0.0, (0.9, 0.95), 10, 0, 0.1, grad_clip=0.5)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    model.weight.grad = torch.full_like(model.weight, 3.0)  # norm 24
    task.on_before_optimizer_step(LightningOptimizer(opt))
    assert torch.allclose(opt.grad_scale, torch.tensor(24.0 / 0.5), rtol=1e-6)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y=None):
        out = self.lin(x)
        return out, (out.float() ** 2).mean() * 100  # large gradients: every step clips


@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "bf16-mixed"])
def test_lightning_steps_clip_with_a_fused_adamw_as_with_clip_grad_norm_(monkeypatch, precision):
    """Through Lightning's loop (the hook order: zero_grad's hook, backward, on_before_optimizer_step, step),
    a fused AdamW as on a GPU, at every precision the harness takes (bf16 gradients: an fp32 factor); the
    factor holds for its step only."""
    import lightning as L

    import harness.task as task_mod

    def fit(fused: bool):
        monkeypatch.setattr(task_mod, "make_optimizer",
                            lambda model, lr, wd, betas, _fused=True: torch.optim.AdamW(model.parameters(), lr=lr,
                                                                                       fused=fused))
        torch.manual_seed(0)
        task = LanguageModelTask(_Tiny(), 1e-2, 0.0, (0.9, 0.95), 3, 0, 1.0, grad_clip=0.5)
        if not fused:  # the reference: clip_grad_norm_ before a plain step
            monkeypatch.setattr(task_mod, "clip_gradients",
                                lambda params, max_norm, opt: torch.nn.utils.clip_grad_norm_(params, max_norm))
        data = torch.utils.data.DataLoader([(torch.randn(16, generator=torch.Generator().manual_seed(i)),
                                             torch.zeros(1)) for i in range(12)], batch_size=4)
        trainer = L.Trainer(accelerator="cpu", precision=precision, max_steps=3, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(task, data)
        monkeypatch.setattr(task_mod, "clip_gradients", clip_gradients)
        return [p.detach().float() for p in task.model.parameters()], trainer.optimizers[0]

    want, _ = fit(False)
    got, opt = fit(True)
    tol = 1e-5 if precision != "bf16-true" else 2e-2
    assert all(torch.allclose(a, b, rtol=tol, atol=tol * 1e-2) for a, b in zip(got, want))
    assert opt.grad_scale.dtype == torch.float32  # (set by the last step: no zero_grad came after it)
    LanguageModelTask(_Tiny(), 1e-2, 0.0, (0.9, 0.95), 3, 0, 1.0).on_before_zero_grad(opt)
    assert not hasattr(opt, "grad_scale")
