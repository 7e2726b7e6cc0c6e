"""The fused cross-entropy drivers (kernels/methods/cuda/ce_driver.py) on CPU, with reference primitives
written in PyTorch: the autograd, the reductions and ignored targets, the chunking, tied weights,
autocast, a second backward, opcheck and full-graph compile. The CUDA primitives themselves are tested
on a GPU (tests/test_cuda_cross_entropy.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.linear_ce import chunk_rows as default_chunk_rows  # what the driver chunks by
from kernels.methods.cuda.ce_driver import make_cross_entropy, make_linear_cross_entropy

CALLS = {"scale": 0}


def ref_ce_rows(logits, targets, ignore_index, grad_scale=None, grad=None):
    x = logits.float()
    valid = targets != ignore_index
    t = torch.where(valid, targets, torch.zeros_like(targets))
    loss = torch.where(valid, torch.logsumexp(x, -1) - x.gather(1, t[:, None])[:, 0], torch.zeros((), dtype=x.dtype))
    if grad is not None:
        p = torch.softmax(x, -1)
        p.scatter_add_(1, t[:, None], -valid[:, None].to(p.dtype))
        if grad_scale is not None:
            p = p * (grad_scale.reshape(-1, 1) if grad_scale.numel() > 1 else grad_scale.reshape(()))
        grad.copy_(torch.where(valid[:, None], p, torch.zeros((), dtype=p.dtype)))  # (may be logits: in place)
    return loss


@torch.library.custom_op("test_driver::scale_grad_", mutates_args=("grad",))
def _scale_grad_op(grad: torch.Tensor, g: torch.Tensor) -> None:
    """(an op, as the CUDA primitive is: traced, a mutation of a saved tensor shows as auto_functionalized)"""
    grad.mul_(g.reshape(-1, *([1] * (grad.dim() - 1))) if g.numel() > 1 else g.reshape(()))


def ref_scale_grad_(grad, g):
    if not torch.compiler.is_compiling():
        CALLS["scale"] += 1
    _scale_grad_op(grad, g)


CE = make_cross_entropy("test_driver_ce", ref_ce_rows, ref_scale_grad_)
LCE = make_linear_cross_entropy("test_driver_lce", ref_ce_rows, ref_scale_grad_)


def _targets(n, v, ignore_index=-100, ignored=(1, 5), gen=None):
    t = torch.randint(0, v, (n,), generator=gen)
    for i in ignored:
        if i < n:
            t[i] = ignore_index
    return t


def _ref_loss(x, t, ignore_index, reduction):
    loss = F.cross_entropy(x.double(), t, ignore_index=ignore_index, reduction=reduction)
    if reduction == "mean" and bool((t == ignore_index).all()):
        return loss.nan_to_num(0.0) * 0 + (x.double().sum() * 0)  # torch: NaN; the contract: 0
    return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_matches_float64(reduction, ignore_index, seeded):
    x = (torch.randn(37, 11, generator=seeded) * 3).requires_grad_(True)
    t = _targets(37, 11, ignore_index, gen=seeded)
    x64 = x.detach().double().requires_grad_(True)
    loss = CE(x, t, ignore_index, reduction)
    ref = _ref_loss(x64, t, ignore_index, reduction)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    w = torch.randn(ref.shape, dtype=torch.float64, generator=seeded) if reduction == "none" else torch.tensor(1.7)
    (loss * w.float()).sum().backward()
    (ref * w).sum().backward()
    assert torch.allclose(loss.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)
    assert (x.grad[t == ignore_index] == 0).all()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_targets_ignored_gives_zero_loss_and_gradient(reduction):
    x = torch.randn(6, 5, requires_grad=True)
    t = torch.full((6,), -100)
    loss = CE(x, t, -100, reduction)
    assert torch.isfinite(loss).all() and (loss == 0).all()
    loss.sum().backward()
    assert (x.grad == 0).all()


def test_backward_at_grad_output_one_only_launches_the_scale():
    x = torch.randn(8, 5, requires_grad=True)
    before = CALLS["scale"]
    CE(x, torch.randint(0, 5, (8,)), -100, "mean").backward()
    assert CALLS["scale"] == before + 1


def test_second_backward_raises_clearly():
    x = torch.randn(8, 5, requires_grad=True)
    loss = CE(x, torch.randint(0, 5, (8,)), -100, "mean")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_cross_entropy_op_passes_opcheck():
    x = torch.randn(9, 7)
    t = _targets(9, 7)
    for reduction in ("mean", "sum", "none"):
        for need_grad in (True, False):
            torch.library.opcheck(CE.ops[0], (x, t, -100, reduction, need_grad))


def _lce_inputs(n=50, c=16, v=23, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g).to(dtype).requires_grad_(True)
    w = (torch.randn(v, c, generator=g) * 0.3).to(dtype).requires_grad_(True)
    return h, w, _targets(n, v, gen=g)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_rows", [7, 16, 1000])
def test_linear_cross_entropy_matches_linear_then_cross_entropy(reduction, chunk_rows):
    h, w, t = _lce_inputs()
    h64, w64 = (a.detach().double().requires_grad_(True) for a in (h, w))
    loss = LCE(h, w, t, -100, reduction, chunk_rows)
    ref = F.cross_entropy(F.linear(h64, w64), t, reduction=reduction)
    g = torch.randn(ref.shape, dtype=torch.float64) if reduction == "none" else torch.tensor(0.3, dtype=torch.float64)
    (loss.double() * g).sum().backward()
    (ref * g).sum().backward()
    assert torch.allclose(loss.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(h.grad.double(), h64.grad, atol=1e-5, rtol=1e-4)
    assert torch.allclose(w.grad.double(), w64.grad, atol=1e-5, rtol=1e-4)


def test_linear_cross_entropy_tied_weights():
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(23, 16, generator=g).requires_grad_(True)
    idx = torch.randint(0, 23, (40,), generator=g)
    t = _targets(40, 23, gen=g)
    ref_w = emb.detach().double().requires_grad_(True)
    h = F.embedding(idx, emb) * 0.5
    LCE(h, emb, t, -100, "mean", 16).backward()
    F.cross_entropy(F.linear(F.embedding(idx, ref_w) * 0.5, ref_w), t).backward()
    assert torch.allclose(emb.grad.double(), ref_w.grad, atol=1e-5, rtol=1e-4)


def test_linear_cross_entropy_under_autocast_flows_to_float32_inputs():
    h, w, t = _lce_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = LCE(h, w, t, -100, "mean", 16)
    loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    h64, w64 = (a.detach().double().requires_grad_(True) for a in (h, w))
    F.cross_entropy(F.linear(h64, w64), t).backward()
    assert abs(loss.item() - F.cross_entropy(F.linear(h64, w64), t).item()) < 3e-2
    assert (h.grad.double() - h64.grad).norm() / h64.grad.norm() < 3e-2
    assert (w.grad.double() - w64.grad).norm() / w64.grad.norm() < 3e-2


def test_linear_cross_entropy_second_backward():
    h, w, t = _lce_inputs()
    loss = LCE(h, w, t, -100, "sum", 16)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    h.grad = w.grad = None  # 'none' recomputes in the backward: twice is fine
    loss = LCE(h, w, t, -100, "none", 16)
    loss.sum().backward(retain_graph=True)
    first = h.grad.clone()
    loss.sum().backward()
    assert torch.allclose(h.grad, 2 * first)


def test_linear_cross_entropy_all_ignored_and_opcheck():
    h, w, _ = _lce_inputs(n=12)
    t = torch.full((12,), -100)
    loss = LCE(h, w, t, -100, "mean", 5)
    loss.backward()
    assert loss.item() == 0 and (h.grad == 0).all() and (w.grad == 0).all()
    t = _targets(12, 23)
    fwd, bwd = LCE.ops
    for reduction in ("mean", "sum", "none"):
        torch.library.opcheck(fwd, (h.detach(), w.detach(), t, -100, reduction, 5, True, True))
    torch.library.opcheck(bwd, (h.detach(), w.detach(), t, -100, torch.randn(12), 5, True, False))


def test_default_chunk_rows_keeps_the_extra_memory_small():
    rows = default_chunk_rows(16384, 50304, 2)
    assert rows == 3280  # 5 chunks of one size
    extra = rows * 50304 * 2 + 50304 * 768 * 4 + 16384 * 768 * 2  # a chunk, the fp32 weight grad, grad_hidden
    assert extra <= 0.5 * 2**30
    assert default_chunk_rows(10, 50304, 2) == 10 and default_chunk_rows(4, 2**40, 4) == 1


@pytest.mark.slow
def test_fullgraph_compile_equals_eager():
    x = torch.randn(20, 9, requires_grad=True)
    t = _targets(20, 9, ignored=(0, 3, 4))
    h, w, tl = _lce_inputs(n=30)

    def f(x, t, h, w, tl):
        return CE(x, t, -100, "mean") + LCE(h, w, tl, -100, "mean", 8) + CE(x, t, -100, "none").sum()

    eager = f(x, t, h, w, tl)
    eager.backward()
    grads = [a.grad.clone() for a in (x, h, w)]
    for a in (x, h, w):
        a.grad = None
    compiled = torch.compile(f, fullgraph=True)(x, t, h, w, tl)
    compiled.backward()
    assert torch.allclose(compiled, eager, atol=1e-6)
    for a, g in zip((x, h, w), grads):
        assert torch.allclose(a.grad, g, atol=1e-6)


def test_compiled_linear_backward_scales_out_of_place():
    """Traced, the chunked linear loss's backward multiplies the saved gradients (a product Inductor fuses
    into their consumers) instead of scaling them in place by the primitive (an op mutating saved tensors,
    which Inductor would first copy); same gradients."""
    from tests.test_linear_cross_entropy_compiled import _compile_recording

    h, w, tl = _lce_inputs(n=30)

    def f(h, w, tl):
        return LCE(h, w, tl, -100, "mean", 8) * 0.75

    eager = f(h, w, tl)
    eager.backward()
    grads = [a.grad.clone() for a in (h, w)]
    h.grad = w.grad = None
    compiled_f, ops = _compile_recording(f)
    compiled = compiled_f(h, w, tl)
    compiled.backward()
    assert not any("auto_functionalized" in op or "scale_grad" in op for op in ops), ops
    assert torch.allclose(compiled, eager, atol=1e-6)
    for a, g in zip((h, w), grads):
        assert torch.allclose(a.grad, g, atol=1e-6)
