"""The model, its softmax seam, and applying / undoing a method."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.methods import apply_accel
from models import GPT, GPTConfig, MaterializedAttention, SDPAttention, attention_cores

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFG = GPTConfig(vocab_size=97, block_size=24, n_layer=2, n_head=2, n_embd=32)


def loss_and_grads(model, idx):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, idx.roll(-1, dims=1))
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("method", [m for m in kernels.runnable_methods()] + ["sdpa"])
def test_model_loss_and_grads_match_torch(method):
    torch.manual_seed(0)
    model = GPT(CFG).to(DEVICE)
    idx = torch.randint(0, CFG.vocab_size, (3, 24), device=DEVICE)
    apply_accel(model, "materialized", "torch")
    ref_loss, ref_grads = loss_and_grads(model, idx)
    if method == "sdpa":
        apply_accel(model, "sdpa", None)
    else:
        apply_accel(model, "materialized", method)
    loss, grads = loss_and_grads(model, idx)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    for name, g in grads.items():
        rel = (g - ref_grads[name]).norm() / ref_grads[name].norm()
        assert rel <= 1e-4, f"{name}: relative gradient difference {rel:.2e}"


def test_swap_and_undo():
    model = GPT(CFG)
    originals = [a.core for a in attention_cores(model)]
    undo = apply_accel(model, "sdpa", None)
    assert all(isinstance(a.core, SDPAttention) for a in attention_cores(model))
    undo()
    assert [a.core for a in attention_cores(model)] == originals
    undo = apply_accel(model, "materialized", "naive")
    cores = [a.core for a in attention_cores(model)]
    assert all(isinstance(c, MaterializedAttention) and "naive" in c.softmax_fn.__name__ for c in cores)
    undo()
    assert [a.core for a in attention_cores(model)] == originals


def test_apply_unknown_method_fails_clearly():
    with pytest.raises(kernels.UnknownMethodError, match="'nope'"):
        apply_accel(GPT(CFG), "materialized", "nope")
    with pytest.raises(ValueError, match="attention core"):
        apply_accel(GPT(CFG), "flash9", None)


def test_attention_hands_scaled_causal_scores_to_the_softmax():
    seen = {}

    def spy(scores, scale, causal):
        seen.update(shape=tuple(scores.shape), scale=scale, causal=causal)
        return kernels.softmax(scores, scale=scale, causal=causal, method="torch")

    model = GPT(CFG)
    for a in attention_cores(model):
        a.core = MaterializedAttention(spy)
    model(torch.randint(0, CFG.vocab_size, (2, 10)))
    assert seen == {"shape": (2, CFG.n_head, 10, 10), "scale": pytest.approx((32 // 2) ** -0.5), "causal": True}


def test_flops_per_token_formula():
    model = GPT(CFG)
    c = CFG
    # per block: qkv 3C^2 + proj C^2 + mlp 8C^2 = 12 C^2; plus the (tied) head V*C
    n = c.n_layer * 12 * c.n_embd**2 + c.vocab_size * c.n_embd
    assert model.matmul_params() == n
    assert model.flops_per_token(24) == 6 * n + 12 * c.n_layer * c.n_embd * 24


def test_rejects_sequence_longer_than_context():
    with pytest.raises(ValueError, match="block_size"):
        GPT(CFG)(torch.zeros(1, CFG.block_size + 1, dtype=torch.long))


def test_loss_falls_in_a_few_dozen_steps():
    torch.manual_seed(0)
    model = GPT(CFG)
    apply_accel(model, "materialized", "torch")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # a learnable stream: token t+1 = (token t + 1) mod V
    start = torch.randint(0, CFG.vocab_size, (8, 1))
    seq = (start + torch.arange(25)) % CFG.vocab_size
    x, y = seq[:, :-1], seq[:, 1:]
    losses = []
    for _ in range(40):
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
