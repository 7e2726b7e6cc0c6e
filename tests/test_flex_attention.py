"""The flex method (kernels/methods/flex.py): FlexAttention through torch.compile with the contract's
bottom-right causal block mask. This torch runs FlexAttention's forward on the CPU (no backward), so
the CPU tests call the method's function directly, forward only; the GPU tests go through the
registry with gradients."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods import flex

HAS_CUDA = torch.cuda.is_available()


def _qkv(B, H, tq, tk, d, dtype, device, layout="bhtd", grad=False):
    g = torch.Generator().manual_seed(tq * 1000 + tk)
    if layout == "bthd":
        q, k, v = (torch.randn(B, t, H, d, generator=g).to(device, dtype).transpose(1, 2) for t in (tq, tk, tk))
    else:
        q, k, v = (torch.randn(B, H, t, d, generator=g).to(device, dtype) for t in (tq, tk, tk))
    return [t.requires_grad_(grad) for t in (q, k, v)]


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a GPU")
def test_unavailable_on_the_cpu_says_why():
    reason = kernels.available_methods()["flex"].reason
    assert "CUDA GPU" in reason and "backward" in reason
    with pytest.raises(kernels.MethodUnavailableError, match="flex"):
        kernels.attention(*_qkv(1, 1, 4, 4, 16, torch.float32, "cpu"), method="flex")


# (each shape a cold FlexAttention compile, ~6 s in CI: Tq > Tk, the rows with no key, in the slow set)
@pytest.mark.parametrize("tq,tk", [(20, 45), pytest.param(45, 20, marks=pytest.mark.slow)], ids=["Tq<Tk", "Tq>Tk"])
def test_forward_matches_float64_with_bottom_right_mask(tq, tk):
    device = "cuda" if HAS_CUDA else "cpu"
    q, k, v = _qkv(1, 2, tq, tk, 16, torch.float32, device)
    out = flex.flex_attention_fn(q, k, v, 0.3, True, 0.0)
    ref = kernels.reference_attention(q, k, v, scale=0.3, causal=True)
    assert kernels.relative_error(out, ref) <= kernels.ATTN_FWD_TOL[torch.float32]
    if tq > tk:  # queries with no key: zeros, never NaN
        assert (out[:, :, : tq - tk] == 0).all()
    n = flex.compiled_signatures()
    flex.flex_attention_fn(q, k, v, 0.3, True, 0.0)  # the same signature: no new compile
    assert flex.compiled_signatures() == n


def test_dropout_is_refused_naming_the_methods_that_drop_out():
    q, k, v = _qkv(1, 1, 4, 4, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="no dropout.*sdpa"):
        flex.flex_attention_fn(q, k, v, 0.25, True, 0.1)


def test_config_file():
    from pathlib import Path

    import yaml

    conf = yaml.safe_load((Path(__file__).parents[1] / "conf/accel/flex.yaml").read_text())
    assert conf == {"name": "flex", "method": "flex"}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 12, 1024, 64), (8, 16, 2048, 128), (2, 4, 300, 77, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_against_float64_on_two_heads(shape):
    B, H, tq, *rest = shape
    tk, d = (tq, rest[0]) if len(rest) == 1 else rest
    q, k, v = _qkv(B, H, tq, tk, d, torch.bfloat16, "cuda", layout="bthd", grad=True)
    out = kernels.attention(q, k, v, method="flex")
    do = torch.randn_like(out)
    out.backward(do)
    sub = [t.detach()[:1, :2].double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*sub)
    ref.backward(do[:1, :2].double())
    assert kernels.relative_error(out[:1, :2], ref) <= kernels.ATTN_FWD_TOL[torch.bfloat16]
    for got, want in zip((q.grad, k.grad, v.grad), (t.grad for t in sub)):
        assert kernels.relative_error(got[:1, :2], want) <= kernels.ATTN_BWD_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_inside_a_fullgraph_compile():
    q, k, v = _qkv(2, 4, 256, 256, 64, torch.bfloat16, "cuda")
    f = lambda q, k, v: kernels.attention(q * 1.0, k, v, method="flex")  # noqa: E731
    assert kernels.relative_error(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v)) < 1e-2


@pytest.mark.gpu
def test_gpu_gpt_training_step_matches_torch():
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    def losses(method):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=512, context=256, n_layer=2, n_head=4, n_embd=256)).cuda()
        apply_accel(model, method, patch=["attention"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        idx = torch.randint(0, 512, (4, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        out = []
        for _ in range(3):
            with torch.autocast("cuda", torch.bfloat16):
                _, loss = model(idx, idx.roll(-1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
        return out

    ref, got = losses("torch"), losses("flex")
    assert all(abs(a - b) <= 2e-2 * abs(a) for a, b in zip(ref, got)), (ref, got)
