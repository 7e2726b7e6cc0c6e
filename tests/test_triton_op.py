"""The Triton method's torch ops: registration, a clear error for inputs it cannot take, opcheck, what is
saved for backward, and a fullgraph torch.compile of a model that uses it.

On a CPU these run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.runtime import availability
from tests.helpers import random_scores

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_cpu_tensor_without_interpreter_is_a_clear_error(monkeypatch, request):
    monkeypatch.setattr(availability, "interpreter_enabled", lambda: False)
    kernels.refresh()  # the registry caches availability per process: ask again now, and after the test
    request.addfinalizer(kernels.refresh)
    if not torch.cuda.is_available():  # through the registry: the method says why it cannot run
        with pytest.raises(kernels.MethodUnavailableError, match="CUDA GPU"):
            kernels.softmax(torch.randn(2, 8), method="triton")
    with pytest.raises(ValueError, match="CUDA tensors"):  # the op itself, called directly
        torch.ops.softmax_harness.triton_softmax_fwd(torch.randn(2, 8), 1.0, False)


def test_opcheck(seeded):
    x = random_scores((2, 3, 8, 8), torch.float32, DEVICE, gen=seeded)
    torch.library.opcheck(torch.ops.softmax_harness.triton_softmax_fwd.default, (x, 0.5, True))
    y = torch.softmax(x, -1)
    torch.library.opcheck(torch.ops.softmax_harness.triton_softmax_bwd.default, (y, torch.randn_like(y), 0.5, True))


def test_only_the_output_is_saved_for_backward(seeded):
    x = random_scores((4, 16), torch.float32, DEVICE, gen=seeded).requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = kernels.softmax(x, method="triton")
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


@pytest.mark.slow
def test_fullgraph_compile_of_a_model_using_it():
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context=16, n_layer=1, n_head=2, n_embd=32)).to(DEVICE)
    idx = torch.randint(0, 64, (2, 16), device=DEVICE)
    ref_logits, _ = model(idx)
    apply_accel(model, "triton")
    compiled = torch.compile(model, fullgraph=True)  # a graph break would raise
    logits, loss = compiled(idx, idx)
    loss.backward()
    assert torch.allclose(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_eager_route_through_the_cpp_apply_matches_function_apply(seeded):
    """The eager route enters the autograd.Function through the C++ apply (Function.apply's Python
    skipped where no functorch transform is active): same output, same gradient, same graph node."""
    from kernels.methods.triton.softmax import op

    assert op._raw_apply is not None
    x = random_scores((2, 3, 16, 16), torch.float32, DEVICE, gen=seeded).requires_grad_(True)
    dy = torch.randn(x.shape, generator=seeded).to(DEVICE)
    y_fast = op.triton_softmax(x, 0.5, True)
    y_ref = op._EagerSoftmax.apply(x, 0.5, True)
    assert type(y_fast.grad_fn) is type(y_ref.grad_fn) and torch.equal(y_fast, y_ref)
    (g_fast,), (g_ref,) = torch.autograd.grad(y_fast, x, dy), torch.autograd.grad(y_ref, x, dy)
    assert torch.equal(g_fast, g_ref)
