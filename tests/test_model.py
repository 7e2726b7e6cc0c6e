"""The model, its two seams (attention core, loss), and applying / undoing a method."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.accel import AccelError, apply_accel, patched_ops
from models import GPT, AttentionCore, GPTConfig, attention_cores, set_loss

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFG = GPTConfig(vocab_size=97, context=24, n_layer=2, n_head=2, n_embd=32)


def loss_and_grads(model, idx):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, idx.roll(-1, dims=1))
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("method", [m for m in kernels.runnable_methods(op="attention") if not kernels.get_method(m).peer])
def test_model_loss_and_grads_match_torch(method):
    torch.manual_seed(0)
    model = GPT(CFG).to(DEVICE)
    idx = torch.randint(0, CFG.vocab_size, (3, 24), device=DEVICE)
    apply_accel(model, "torch")
    ref_loss, ref_grads = loss_and_grads(model, idx)
    apply_accel(model, method)
    loss, grads = loss_and_grads(model, idx)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    for name, g in grads.items():
        rel = (g - ref_grads[name]).norm() / ref_grads[name].norm()
        assert rel <= 1e-4, f"{name}: relative gradient difference {rel:.2e}"


def test_swap_and_undo():
    model = GPT(CFG)
    originals = [a.core for a in attention_cores(model)]
    applied = apply_accel(model, "sdpa")
    assert applied.attention == "native" and applied.loss is None  # sdpa has no cross-entropy: loss untouched
    assert all("sdpa" in a.core.attention_fn.__name__ for a in attention_cores(model))
    applied.undo()
    assert [a.core for a in attention_cores(model)] == originals
    applied = apply_accel(model, "naive")
    assert applied.attention == "composed"  # q k^T -> naive softmax -> v
    cores = [a.core for a in attention_cores(model)]
    assert all(isinstance(c, AttentionCore) and "naive" in c.attention_fn.__name__ for c in cores)
    applied.undo()
    assert [a.core for a in attention_cores(model)] == originals


def test_apply_unknown_method_fails_clearly():
    with pytest.raises(kernels.UnknownMethodError, match="'nope'"):
        apply_accel(GPT(CFG), "nope")
    with pytest.raises(AccelError, match="provides none"):
        apply_accel(GPT(CFG), "sdpa", patch=["loss"])
    with pytest.raises(AccelError, match="loss_form"):
        apply_accel(GPT(CFG), "torch", loss_form="fused")


def _state(model):
    return [a.core for a in attention_cores(model)], model.loss_fn, model.loss_form


def test_apply_accel_loss_method_takes_the_loss_from_another_method():
    model = GPT(CFG)
    before = _state(model)
    applied = apply_accel(model, "sdpa", options={"backend": "math"}, loss_method="naive")
    assert (applied.method, applied.loss_method) == ("sdpa", "naive")
    assert (applied.attention, applied.loss) == ("native", "native")
    assert all(a.core.attention_fn is kernels.bind("sdpa", "attention", backend="math") for a in attention_cores(model))
    assert model.loss_fn.func is kernels.bind("naive", "cross_entropy")  # the options went to sdpa alone
    ops = patched_ops(applied)
    assert ops == {"attention": kernels.bind("sdpa", "attention", backend="math"),
                   "cross_entropy": kernels.bind("naive", "cross_entropy")}
    assert applied.as_dict()["loss_method"] == "naive" and "(naive)" in applied.describe()
    applied.undo()
    assert _state(model) == before
    plain = apply_accel(model, "torch")  # no loss_method: both from the method, as before
    assert plain.loss_method is None and plain.as_dict()["loss_method"] == "torch"
    assert patched_ops(plain)["cross_entropy"] is kernels.bind("torch", "cross_entropy")
    assert "(" not in plain.describe().split("loss=")[1]


def _torch_reference():
    """A seeded model, a batch, and the model's loss and gradients with the torch method (then undone)."""
    torch.manual_seed(0)
    model = GPT(CFG).to(DEVICE)
    idx = torch.randint(0, CFG.vocab_size, (3, 24), device=DEVICE)
    ref = apply_accel(model, "torch")
    ref_loss, ref_grads = loss_and_grads(model, idx)
    ref.undo()
    return model, idx, ref_loss, ref_grads


def test_apply_accel_loss_method_linear_form_matches_torch():
    model, idx, ref_loss, ref_grads = _torch_reference()
    applied = apply_accel(model, "torch", loss_form="linear", loss_method="naive")
    assert model.loss_form == "linear" and model.loss_fn.func is kernels.bind("naive", "linear_cross_entropy")
    assert applied.loss == "composed" and applied.loss_method == "naive"
    loss, grads = loss_and_grads(model, idx)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    assert all((g - ref_grads[n]).norm() <= 1e-4 * ref_grads[n].norm() for n, g in grads.items())


@pytest.mark.skipif(not all(m in kernels.runnable_methods() for m in ("flash", "triton")),
                    reason="flash and triton need a GPU or Triton's CPU interpreter")
def test_apply_accel_flash_attention_with_the_triton_linear_loss():
    model, idx, ref_loss, ref_grads = _torch_reference()
    applied = apply_accel(model, "flash", loss_form="linear", loss_method="triton")  # accel=flash_linear
    assert patched_ops(applied) == {"attention": kernels.bind("flash", "attention"),
                                    "attention_qkv": kernels.bind("flash", "attention_qkv"),
                                    "linear_cross_entropy": kernels.bind("triton", "linear_cross_entropy")}
    loss, grads = loss_and_grads(model, idx)
    assert abs(loss.item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())
    for name, g in grads.items():
        assert (g - ref_grads[name]).norm() <= 1e-3 * ref_grads[name].norm(), name


def test_apply_accel_bad_loss_method_fails_before_patching():
    model = GPT(CFG)
    before = _state(model)
    with pytest.raises(kernels.UnknownMethodError, match="'nope'"):
        apply_accel(model, "torch", loss_method="nope")
    off = kernels.Method(name="_test_off", cross_entropy=kernels.get_method("torch").cross_entropy, summary="test",
                         unavailable_reason=lambda: "test: never here")
    kernels.register(off)
    try:
        with pytest.raises(kernels.MethodUnavailableError, match="never here"):
            apply_accel(model, "torch", loss_method="_test_off")
    finally:
        kernels.unregister(off.name)
    with pytest.raises(AccelError, match=r"loss_method='sdpa'.*provides cross_entropy; 'sdpa' provides: attention"):
        apply_accel(model, "torch", loss_method="sdpa")  # sdpa has no cross-entropy
    with pytest.raises(AccelError, match="needs a method that provides linear_cross_entropy"):
        apply_accel(model, "torch", loss_form="linear", loss_method="sdpa")
    with pytest.raises(AccelError, match=r"accel.patch=\['attention'\] does not patch the loss"):
        apply_accel(model, "torch", patch=["attention"], loss_method="naive")  # nothing for the loss method to do
    assert _state(model) == before


def test_patch_narrows_to_the_attention_and_the_model_never_branches_on_a_name():
    model = GPT(CFG)
    default_loss = model.loss_fn
    applied = apply_accel(model, "torch", patch=["attention"])
    assert applied.attention == "composed" and applied.loss is None and model.loss_fn is default_loss


def test_attention_hands_scaled_causal_scores_to_the_softmax():
    seen = {}

    def spy(scores, scale, causal):
        seen.update(shape=tuple(scores.shape), scale=scale, causal=causal)
        return kernels.softmax(scores, scale=scale, causal=causal, method="torch")

    m = kernels.Method(name="_test_spy", softmax=spy, summary="test")
    kernels.register(m)
    try:
        model = GPT(CFG)
        apply_accel(model, "_test_spy")
        model(torch.randint(0, CFG.vocab_size, (2, 10)))
    finally:
        kernels.unregister(m.name)
    assert seen == {"shape": (2, CFG.n_head, 10, 10), "scale": pytest.approx((32 // 2) ** -0.5), "causal": True}


def test_loss_seam_takes_logits_or_the_hidden_states_and_the_tied_weight():
    torch.manual_seed(0)
    model = GPT(CFG)
    idx = torch.randint(0, CFG.vocab_size, (2, 12))
    _, ref = model(idx, idx.roll(-1, 1))
    seen = {}

    def linear_loss(hidden, weight, targets):
        seen.update(hidden=tuple(hidden.shape), tied=weight is model.wte.weight)
        return torch.nn.functional.cross_entropy(hidden @ weight.T, targets)

    undo = set_loss(model, linear_loss, "linear")
    logits, loss = model(idx, idx.roll(-1, 1))
    assert logits is None and seen == {"hidden": (24, CFG.n_embd), "tied": True}
    assert torch.allclose(loss, ref, rtol=1e-6)
    undo()
    assert model.loss_form == "logits"
    with pytest.raises(ValueError, match="loss form"):
        set_loss(model, linear_loss, "hidden")


def test_flops_per_token_formula():
    model = GPT(CFG)
    c = CFG
    # per block: qkv 3C^2 + proj C^2 + mlp 8C^2 = 12 C^2; plus the (tied) head V*C
    n = c.n_layer * 12 * c.n_embd**2 + c.vocab_size * c.n_embd
    assert model.matmul_params() == n
    assert model.flops_per_token(24) == 6 * n + 12 * c.n_layer * c.n_embd * 24


def test_rejects_sequence_longer_than_context():
    with pytest.raises(ValueError, match="context"):
        GPT(CFG)(torch.zeros(1, CFG.context + 1, dtype=torch.long))


def test_loss_falls_in_a_few_dozen_steps():
    torch.manual_seed(0)
    model = GPT(CFG)
    apply_accel(model, "torch")
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
