"""The registry: methods implement ops, missing ops are composed, bound functions are cached, and every
error says what was wrong and what is accepted."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import registry


@pytest.fixture
def throwaway():
    names = []

    def add(method: kernels.Method) -> str:
        kernels.register(method)
        names.append(method.name)
        return method.name

    yield add
    for n in names:
        kernels.unregister(n)


def test_bind_is_cached_per_method_op_and_options():
    assert kernels.bind("torch") is kernels.bind("torch", "softmax")
    assert kernels.bind("torch", "attention") is kernels.bind("torch", "attention")
    assert kernels.bind("torch", "attention") is not kernels.bind("torch", "softmax")
    assert kernels.bind("sdpa", "attention", backend="math") is kernels.bind("sdpa", "attention", backend="math")
    assert kernels.bind("sdpa", "attention", backend="math") is not kernels.bind("sdpa", "attention")


def test_availability_is_computed_once_until_refreshed(throwaway):
    calls = []

    def reason():
        calls.append(1)
        return None

    name = throwaway(kernels.Method("_test_counted", softmax=lambda x, s, c: x, summary="t", unavailable_reason=reason))
    for _ in range(3):
        kernels.available_methods()
        kernels.softmax(torch.zeros(2), method=name)
    assert len(calls) == 1
    kernels.refresh()
    kernels.available_methods()
    assert len(calls) == 2


def test_cached_bind_still_raises_clear_errors(throwaway):
    kernels.bind("torch")
    with pytest.raises(kernels.UnknownMethodError, match="'nope'.*runnable here"):
        kernels.bind("nope")
    with pytest.raises(kernels.UnknownMethodError):
        kernels.softmax(torch.zeros(2), method="nope")  # the one-shot path misses the cache and asks
    name = throwaway(kernels.Method("_test_never", softmax=lambda x, s, c: x, summary="t",
                                    unavailable_reason=lambda: "it needs a quantum computer"))
    with pytest.raises(kernels.MethodUnavailableError, match="quantum computer.*Methods that can run here: .*torch"):
        kernels.softmax(torch.zeros(2), method=name)


def test_a_method_registered_later_is_visible_and_bindable(throwaway):
    before = kernels.available_methods()
    name = throwaway(kernels.Method("_test_late", softmax=lambda x, s, c: x * 0 + 1, summary="late"))
    assert name not in before and name in kernels.available_methods()
    assert torch.equal(kernels.softmax(torch.zeros(3), method=name), torch.ones(3))


def test_attention_is_composed_from_a_softmax(throwaway):
    seen = []

    def spy(scores, scale, causal):
        seen.append((tuple(scores.shape), scale, causal))
        return kernels.softmax(scores, scale=scale, causal=causal)

    name = throwaway(kernels.Method("_test_spy", softmax=spy, summary="spy"))
    assert kernels.get_method(name).ops() == {"softmax": "native", "attention": "composed"}
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    out = kernels.attention(q, k, v, method=name)
    assert seen == [((2, 3, 5, 5), pytest.approx(8 ** -0.5), True)]
    ref = kernels.reference_attention(q, k, v)
    assert kernels.relative_error(out, ref) < 1e-5


def test_an_op_that_cannot_be_composed_says_what_the_method_has():
    with pytest.raises(kernels.OpNotImplementedError, match="'sdpa' does not implement softmax.*implements: attention"):
        kernels.bind("sdpa", "softmax")
    with pytest.raises(ValueError, match="unknown op 'gelu'"):
        kernels.bind("torch", "gelu")


def test_options_are_checked_against_what_the_method_accepts():
    with pytest.raises(ValueError, match="backend='warp9' is not accepted: one of auto, flash, cudnn"):
        kernels.bind("sdpa", "attention", backend="warp9")
    with pytest.raises(ValueError, match="takes no option 'backend'"):
        kernels.bind("torch", "softmax", backend="cudnn")
    if not torch.cuda.is_available():
        with pytest.raises(kernels.MethodUnavailableError, match="cudnn backend needs a CUDA GPU"):
            kernels.bind("sdpa", "attention", backend="cudnn")
        assert "CUDA GPU" in kernels.unavailable_reason("sdpa", backend="cudnn")
    assert kernels.unavailable_reason("sdpa") is None


def test_a_method_must_implement_an_op_and_register_once(throwaway):
    with pytest.raises(ValueError, match="implements no op"):
        kernels.Method("_test_empty", summary="nothing")
    m = kernels.Method("_test_twice", softmax=lambda x, s, c: x, summary="t")
    throwaway(m)
    with pytest.raises(ValueError, match="registered twice"):
        kernels.register(kernels.Method("_test_twice", softmax=lambda x, s, c: x, summary="other"))


@pytest.mark.parametrize("tq,tk,causal", [(5, 5, True), (3, 7, True), (7, 3, True), (4, 6, False)])
def test_sdpa_follows_the_attention_contract(tq, tk, causal):
    """Bottom-right causal alignment for Tq != Tk, and zeros (never NaN) for queries with no key."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, tq, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, tk, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, tk, 4, generator=g, requires_grad=True)
    out = kernels.attention(q, k, v, causal=causal, method="sdpa")
    ref = kernels.reference_attention(q, k, v, causal=causal)
    assert out.shape == (2, 2, tq, 4) and torch.isfinite(out).all()
    assert kernels.relative_error(out, ref) < 1e-5
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attention_checks_its_inputs():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"shape \(B, H, T, d\)"):
        kernels.attention(q[0], q[0], q[0])
    for k, v in ((torch.randn(1, 2, 3, 5), q), (torch.randn(2, 2, 3, 4), q), (torch.randn(1, 3, 3, 4), q),
                 (q, torch.randn(2, 2, 3, 4)), (q, torch.randn(1, 1, 3, 4)), (q, torch.randn(1, 2, 4, 4))):
        with pytest.raises(ValueError, match="do not match"):  # d; B, H of k; B, H, Tk of v
            kernels.attention(q, k, v)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.attention(q, q.double().float().half(), q)
    with pytest.raises(ValueError, match="dropout_p"):
        kernels.attention(q, q, q, dropout_p=1.5)
    empty = kernels.attention(q, q[:, :, :0], torch.randn(1, 2, 0, 6))  # no key at all: zeros
    assert empty.shape == (1, 2, 3, 6) and (empty == 0).all()


def test_registry_lists_ops_per_method():
    avail = kernels.available_methods(include_timing_only=True)
    assert avail["sdpa"].ops == {"attention": "native"}
    assert avail["torch"].ops["attention"] == "composed"
    assert not avail["floor"].exact and "floor" not in kernels.available_methods()
    assert "sdpa" in kernels.runnable_methods(op="attention") and "sdpa" not in kernels.runnable_methods(op="softmax")
    assert set(registry.OPS) == {"softmax", "attention", "attention_qkv", "cross_entropy", "linear_cross_entropy"}
    assert avail["flash"].ops == {"attention": "native", "attention_qkv": "native"}
    assert "sdpa" in kernels.runnable_methods(op="attention_qkv")  # (composed: provided, not listed)


def test_the_floor_has_a_loss_floor_that_reads_the_logits_once():
    """The floor's cross_entropy is timing only: its forward writes logits / rows (one read, one write, the
    fused loss's traffic), its backward hands that back; 'loss' = the first logit of each row."""
    avail = kernels.available_methods(include_timing_only=True)["floor"]
    assert avail.ops["cross_entropy"] == "native" and avail.ops["linear_cross_entropy"] == "composed"
    x = torch.randn(2, 3, 7, requires_grad=True)
    t = torch.randint(0, 7, (2, 3))
    fn = kernels.bind("floor", "cross_entropy")
    rows = fn(x, t, -100, "none")
    assert rows.shape == (2, 3) and rows.dtype == torch.float32 and torch.equal(rows, x[..., 0].detach())
    assert torch.equal(fn(x, t, -100, "sum"), rows.sum()) and torch.equal(fn(x, t, -100, "mean"), rows.mean())
    fn(x, t, -100, "mean").backward(torch.tensor(5.0))  # (grad_output ignored: timing only)
    assert torch.allclose(x.grad, x.detach() / 6)


@pytest.mark.parametrize("module", ["kernels.runtime.availability", "kernels.methods.flash.ops"])
def test_triton_methods_without_a_gpu_say_how_to_run_the_interpreter(module, monkeypatch):
    import importlib

    mod = importlib.import_module(module)
    # The check reads the interpreter switch of the module that defines it (flash re-exports the runtime's).
    home = importlib.import_module(mod.unavailable_reason.__module__)
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(home, "interpreter_enabled", lambda: False)
    reason = mod.unavailable_reason()
    assert reason.startswith("it needs a CUDA GPU") and "`TRITON_INTERPRET=1 python ...`" in reason
