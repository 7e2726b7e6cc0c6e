"""The cross-entropy contracts (``cross_entropy``, ``linear_cross_entropy``), for every method that
provides them, against float64 (kernels.reference_cross_entropy); the checks' error messages.

Triton runs in its CPU interpreter here (TRITON_INTERPRET=1, set by conftest.py); its own paths, ops
and GPU sizes are in tests/test_triton_cross_entropy.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels
from kernels import BWD_TOL, FWD_TOL, rounding_floor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CE_METHODS = [m for m in kernels.runnable_methods(op="cross_entropy") if not kernels.get_method(m).peer]
LINEAR_METHODS = [m for m in kernels.runnable_methods(op="linear_cross_entropy") if not kernels.get_method(m).peer]
# compiling costs seconds per signature on a CPU: `compile` gets a representative subset there
FAST = [m for m in CE_METHODS if m != "compile" or DEVICE == "cuda"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCTIONS = ["mean", "sum", "none"]
# float16 takes the same reduced-precision path as bfloat16: its cases run with the slow tests
DTYPES_FAST_BF16 = [pytest.param(d, marks=pytest.mark.slow) if d == torch.float16 else d for d in DTYPES]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inside Triton's interpreter


#: a loss near zero: the absolute error a row may carry, in nats (8 units of fp32 rounding at 1)
LOSS_ABS = 8 * 2.0**-24


def loss_tol(method: str, dtype: torch.dtype) -> float:
    """Every method computes the loss in fp32 except `torch` outside autocast, which computes
    F.cross_entropy in the logits' 16-bit dtype (as its users get it)."""
    return FWD_TOL[dtype] if (method == "torch" and dtype != torch.float32) else 1e-5


def grad_tol(method: str, dtype: torch.dtype, ref: torch.Tensor) -> float:
    """Gradients at the dtype's rounding: 3x the error of the exact gradient rounded once (fp32: 1e-5).
    The fused methods may round twice (the forward's store, then the backward's scale when grad_output
    is not 1, or fp16's deferred 1 / n_valid): at most one unit roundoff u each, so 2u norm-wise, which
    a few near-exactly-rounding values can put past 3x the once-rounded error (hypothesis found fp16
    V = 26 at 4.5e-4 against 3.4e-4). u: 2^-11 for fp16, 2^-8 for bf16; Triton's interpreter converts to
    bf16 by truncation, 2^-7. `torch` outside autocast differentiates a 16-bit log-softmax: the
    project's 16-bit backward bounds."""
    if dtype == torch.float32:
        return 1e-5
    if method == "torch":
        return max(BWD_TOL[dtype], 3 * rounding_floor(ref, dtype))
    if method in ("triton", "cuda"):
        u = 2.0**-11 if dtype == torch.float16 else 2.0**-7 if (method == "triton" and DEVICE == "cpu") else 2.0**-8
        return max(3 * rounding_floor(ref, dtype), 2 * u)
    return 3 * rounding_floor(ref, dtype)


def logits_like(shape, dtype, layout="contiguous", spread=3.0, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    *lead, v = shape
    if layout == "contiguous":
        x = torch.randn(*lead, v, generator=g)
    elif layout == "strided":  # every other column: column stride 2
        x = torch.randn(*lead, 2 * v, generator=g)[..., ::2]
    elif layout == "sliced":  # row stride > V
        x = torch.randn(*lead, v + 5, generator=g)[..., 2 : v + 2]
    elif layout == "transposed":  # (T, B, V) seen as (B, T, V): leading dims do not flatten
        x = torch.randn(lead[1], lead[0], v, generator=g).transpose(0, 1)
    else:
        raise ValueError(layout)
    return (x * spread).to(device=DEVICE, dtype=dtype)


def targets_like(lead, v, ignored="some", ignore_index=-100, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, v, tuple(lead), generator=g)
    if ignored == "some":
        t.view(-1)[::3] = ignore_index
    elif ignored == "all":
        t.fill_(ignore_index)
    return t.to(DEVICE)


def run(method, x, t, ignore_index=-100, reduction="mean", go="random", seed=2):
    """Forward and backward of ``method`` and of the float64 reference, with the same grad_output
    ('random' in [0.5, 1.5), or 'one': the plain loss.backward())."""
    x = x.detach().requires_grad_(True)
    loss = kernels.cross_entropy(x, t, method=method, ignore_index=ignore_index, reduction=reduction)
    assert loss.dtype == torch.float32 and loss.device == x.device
    assert tuple(loss.shape) == (tuple(t.shape) if reduction == "none" else ())
    g = torch.Generator().manual_seed(seed)
    dy = torch.rand(loss.shape, generator=g) + 0.5 if go == "random" else torch.ones(loss.shape)
    loss.backward(dy.to(DEVICE))
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    ref = kernels.reference_cross_entropy(x64, t, ignore_index=ignore_index, reduction=reduction)
    ref.backward(dy.to(DEVICE, torch.float64))
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
    return loss, x.grad, ref, x64.grad


def assert_matches(method, x, t, ignore_index=-100, reduction="mean", go="random"):
    loss, grad, ref, ref_grad = run(method, x, t, ignore_index, reduction, go)
    lerr = kernels.relative_error(loss, ref)
    gerr = kernels.relative_error(grad, ref_grad)
    # A row's loss is log(sum of exps) - its target's logit: near zero (the target far above the rest) its fp32
    # log of a sum near 1 is exact only to a few units of 2^-24 in nats, which is no relative bound (hypothesis:
    # naive at 2.1e-4 nats, 3e-5 relative). So: relative, or within LOSS_ABS nats a row (summed for 'sum').
    rows = 1 if reduction != "sum" else max(1, int((t != ignore_index).sum()))
    abs_err = (loss.detach().double() - ref.detach()).abs().max().item() if loss.numel() else 0.0
    assert lerr <= loss_tol(method, x.dtype) or abs_err <= LOSS_ABS * rows, f"loss error {lerr:.2e} ({abs_err:.2e} nats)"
    # the gradient p - onehot of such a row cancels likewise (p near 1): within 2 LOSS_ABS an element (grad_output < 1.5)
    gabs = (grad.detach().double() - ref_grad.detach()).abs().max().item() if grad.numel() else 0.0
    assert gerr <= grad_tol(method, x.dtype, ref_grad) or gabs <= 2 * LOSS_ABS, f"gradient error {gerr:.2e} ({gabs:.2e})"
    return loss, grad


CASES = [  # (shape (..., V), layout, ignored)
    ((3, 1), "contiguous", "none"),  # V = 1: the loss is 0, the gradient 0
    ((4, 7), "contiguous", "some"),
    ((3, 31), "contiguous", "some"),
    ((3, 32), "contiguous", "none"),
    ((3, 33), "contiguous", "some"),
    ((2, 3, 17), "contiguous", "some"),  # leading dims
    ((4, 127), "contiguous", "some"),
    ((4, 128), "strided", "some"),
    ((4, 129), "sliced", "some"),
    ((2, 1000), "contiguous", "none"),
    ((3, 4, 40), "transposed", "some"),
    ((5, 12), "contiguous", "all"),
]


def _id(case):
    shape, layout, ignored = case
    return f"{'x'.join(map(str, shape))}-{layout}-ignored_{ignored}"


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES_FAST_BF16, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("method", FAST)
def test_matches_float64_reference(method, case, dtype, reduction):
    shape, layout, ignored = case
    x = logits_like(shape, dtype, layout)
    t = targets_like(shape[:-1], shape[-1], ignored)
    loss, grad = assert_matches(method, x, t, reduction=reduction)
    if ignored == "all":  # the contract: 0 and a zero gradient, never NaN
        assert torch.count_nonzero(loss).item() == 0 and torch.count_nonzero(grad).item() == 0
    ignored_rows = (t == -100).reshape(-1)
    assert torch.count_nonzero(grad.reshape(-1, shape[-1])[ignored_rows]).item() == 0
    if reduction == "none":
        assert torch.count_nonzero(loss.reshape(-1)[ignored_rows]).item() == 0


@pytest.mark.skipif("compile" not in CE_METHODS, reason="compile cannot run here")
@pytest.mark.parametrize("case", [  # (each a cold inductor compile in CI, 4-12 s: the first in the slow set)
    pytest.param(((2, 3, 33), "transposed", "some", "mean"), marks=pytest.mark.slow), ((4, 129), "strided", "all", "none")])
def test_compile_method_subset(case):
    shape, layout, ignored, reduction = case
    x = logits_like(shape, torch.bfloat16, layout)
    t = targets_like(shape[:-1], shape[-1], ignored)
    assert_matches("compile", x, t, reduction=reduction)


@pytest.mark.parametrize("go", ["one", "random"])
@pytest.mark.parametrize("ignore_index", [0, 5, -1])
@pytest.mark.parametrize("method", FAST)
def test_custom_ignore_index_inside_and_outside_the_vocabulary(method, ignore_index, go):
    """ignore_index may be a real class (0, 5: those targets are ignored, not scored) or -1; grad_output
    1 (the backward's skip in fused methods) and not 1."""
    x = logits_like((6, 9), torch.float32)
    t = torch.tensor([ignore_index, 5, 3, ignore_index, 8, 2], device=DEVICE)
    for reduction in REDUCTIONS:
        loss, grad = assert_matches(method, x, t, ignore_index, reduction, go)
        assert torch.count_nonzero(grad[t == ignore_index]).item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("method", FAST)
def test_large_and_infinite_logits(method, dtype):
    """Logits of 1e4 do not overflow; -inf off the target is fine; a -inf target logit gives loss +inf
    (as F.cross_entropy does) with a finite gradient."""
    x = logits_like((4, 50), dtype)
    x[0] = x[0] * 3e3  # |x| up to ~1e4
    x[1, 10:40] = float("-inf")
    t = torch.tensor([3, 2, 7, 9], device=DEVICE)
    x[2, 7] = float("-inf")
    loss, grad, ref, ref_grad = run(method, x, t, reduction="none")
    assert torch.isinf(loss[2]) and loss[2] > 0
    finite = torch.tensor([0, 1, 3], device=DEVICE)
    assert kernels.relative_error(loss[finite], ref[finite]) <= loss_tol(method, dtype)
    assert torch.isfinite(grad).all()
    assert kernels.relative_error(grad, ref_grad) <= grad_tol(method, dtype, ref_grad)
    assert torch.count_nonzero(grad[1, 10:40]).item() == 0
    mean = kernels.cross_entropy(x, t, method=method)
    assert torch.isinf(mean) and mean > 0


@pytest.mark.parametrize("method", CE_METHODS)
def test_no_targets_gives_zero_and_a_zero_gradient(method):
    x = logits_like((0, 5), torch.float32).requires_grad_(True)
    t = torch.zeros(0, dtype=torch.long, device=DEVICE)
    for reduction in REDUCTIONS:
        loss = kernels.cross_entropy(x, t, method=method, reduction=reduction)
        assert loss.shape == ((0,) if reduction == "none" else ())
        loss.sum().backward()
        assert x.grad.shape == (0, 5)


@pytest.mark.parametrize("method", FAST)
def test_int32_targets_and_no_grad(method):
    x = logits_like((4, 9), torch.float32)
    t = targets_like((4,), 9)
    ref = kernels.reference_cross_entropy(x, t)
    with torch.no_grad():
        loss = kernels.cross_entropy(x, t.int(), method=method)
    assert kernels.relative_error(loss, ref) <= 1e-5


@pytest.mark.parametrize("method", CE_METHODS)
def test_bad_inputs_are_rejected_with_clear_messages(method):
    x = logits_like((4, 9), torch.float32)
    t = targets_like((4,), 9, "none")
    ce = lambda x, t, **kw: kernels.cross_entropy(x, t, method=method, **kw)  # noqa: E731
    # The range of the targets is checked on the host for CPU tensors only: on a GPU it is checked on the
    # device (a device assert for triton and PyTorch, which ends the process: tested in a subprocess in
    # tests/test_triton_cross_entropy.py; a record read by check_targets for cuda: tests/test_cuda_cross_entropy.py)
    if x.device.type == "cpu":
        for bad, first in ((9, 9), (-3, -3), (12, 12)):  # V itself, a negative class, past V
            tb = t.clone()
            tb[2] = bad
            with pytest.raises(ValueError, match=rf"target {first} is outside \[0, 9\) and is not ignore_index \(-100\)"):
                ce(x, tb)
        tb = t.clone()
        tb[1] = -100  # the default ignore_index is not an error, -100 with another ignore_index is
        with pytest.raises(ValueError, match=r"target -100 is outside \[0, 9\) and is not ignore_index \(3\)"):
            ce(x, tb, ignore_index=3)
    with pytest.raises(TypeError, match="integer class targets"):
        ce(x, t.float())
    with pytest.raises(TypeError, match="dtype torch.int64; supported dtypes: float32, float16, bfloat16"):
        ce(x.long(), t)
    with pytest.raises(ValueError, match=r"targets of shape \(3,\) do not match logits of shape \(4, 9\)"):
        ce(x, t[:3])
    with pytest.raises(ValueError, match="V >= 1"):
        ce(x[:, :0], t)
    with pytest.raises(ValueError, match="V >= 1"):
        ce(x[0, 0], t[0])
    with pytest.raises(ValueError, match="reduction='avg' is not accepted: one of mean, sum, none"):
        ce(x, t, reduction="avg")
    with pytest.raises(ValueError, match="on one device"):
        ce(x, t.to("meta"))


# ------------------------------------------------------------------------------------------------
# linear cross-entropy (native for triton, composed from cross_entropy for the others)
# ------------------------------------------------------------------------------------------------
def linear_inputs(n=20, c=16, v=37, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g).to(DEVICE, dtype)
    w = (torch.randn(v, c, generator=g) * 0.5).to(DEVICE, dtype)
    return h, w, targets_like((n,), v, "some", seed=seed + 1)


@pytest.fixture
def small_chunks(monkeypatch):
    """Triton's native linear cross-entropy in chunks of 8 tokens (so every test crosses chunks)."""
    if "triton" in LINEAR_METHODS:
        from kernels.methods.triton.cross_entropy import linear as lce

        monkeypatch.setattr(lce, "LINEAR_CHUNK_BYTES", 8 * 37 * 4)


@pytest.mark.parametrize("go", ["one", "random"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES_FAST_BF16, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("method", [m for m in LINEAR_METHODS if m in FAST])
def test_linear_matches_the_composed_form(method, dtype, reduction, go, small_chunks):
    """Loss and both gradients against F.linear + cross-entropy in float64 on the same inputs (the
    16-bit methods round the logits to their dtype, which the loss tolerance allows)."""
    h, w, t = linear_inputs(dtype=dtype)
    h.requires_grad_(True)
    w.requires_grad_(True)
    loss = kernels.linear_cross_entropy(h, w, t, method=method, reduction=reduction)
    assert loss.dtype == torch.float32 and tuple(loss.shape) == ((20,) if reduction == "none" else ())
    dy = (torch.rand(loss.shape, generator=torch.Generator().manual_seed(3)) + 0.5 if go == "random"
          else torch.ones(loss.shape)).to(DEVICE)
    loss.backward(dy)
    h64, w64 = (a.detach().double().requires_grad_(True) for a in (h, w))
    ref = kernels.reference_cross_entropy(F.linear(h64, w64), t, reduction=reduction)
    ref.backward(dy.double())
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else FWD_TOL[dtype]  # (the logits and their gradient are rounded)
    assert kernels.relative_error(loss, ref) <= tol
    assert kernels.relative_error(h.grad, h64.grad) <= tol
    assert kernels.relative_error(w.grad, w64.grad) <= tol


@pytest.mark.parametrize("method", [m for m in LINEAR_METHODS if m in FAST])
def test_linear_gradient_of_one_input_only_and_no_grad(method, small_chunks):
    h, w, t = linear_inputs()
    h64, w64 = (a.double().requires_grad_(True) for a in (h, w))
    kernels.reference_cross_entropy(F.linear(h64, w64), t).backward()
    hh, ww = h.clone().requires_grad_(True), w.clone()  # frozen weight
    kernels.linear_cross_entropy(hh, ww, t, method=method).backward()
    assert kernels.relative_error(hh.grad, h64.grad) <= 1e-5 and ww.grad is None
    hh, ww = h.clone(), w.clone().requires_grad_(True)  # frozen hidden states
    kernels.linear_cross_entropy(hh, ww, t, method=method).backward()
    assert kernels.relative_error(ww.grad, w64.grad) <= 1e-5 and hh.grad is None
    with torch.no_grad():
        loss = kernels.linear_cross_entropy(h.requires_grad_(True), w, t, method=method)
    assert not loss.requires_grad and abs(loss.item() - kernels.reference_cross_entropy(h @ w.T, t).item()) <= 1e-5


@pytest.mark.parametrize("method", [m for m in LINEAR_METHODS if m in FAST])
def test_linear_with_every_target_ignored_and_bad_inputs(method):
    h, w, _ = linear_inputs()
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = kernels.linear_cross_entropy(hh, ww, torch.full((20,), -100, device=DEVICE), method=method)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(hh.grad).item() == 0 and torch.count_nonzero(ww.grad).item() == 0
    t = targets_like((20,), 37)
    if DEVICE == "cpu":  # on a GPU the range is checked on the device (see test_bad_inputs_are_rejected...)
        with pytest.raises(ValueError, match=r"target 37 is outside \[0, 37\)"):
            kernels.linear_cross_entropy(h, w, torch.full((20,), 37, device=DEVICE), method=method)
    with pytest.raises(ValueError, match=r"hidden \(20, 16\), weight \(37, 15\)"):
        kernels.linear_cross_entropy(h, w[:, :15], t, method=method)
    with pytest.raises(ValueError, match=r"do not match hidden @ weight.T of shape \(20, 37\)"):
        kernels.linear_cross_entropy(h, w, t[:5], method=method)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU autocast (the GPU tests cover CUDA autocast)")
@pytest.mark.parametrize("method", [m for m in LINEAR_METHODS if m in FAST])
def test_linear_under_autocast_computes_in_the_autocast_dtype(method, small_chunks):
    """fp32 hidden states and weight under bf16 autocast: the loss of the bf16 product (as F.linear
    would compute it), fp32 gradients through the casts; outside autocast, mixed dtypes are refused
    by the native implementation (the composed ones get F.linear's own error)."""
    h, w, t = linear_inputs()
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = kernels.linear_cross_entropy(hh, ww, t, method=method)
    loss.backward()
    hb, wb = (a.bfloat16().double().requires_grad_(True) for a in (h, w))
    ref = kernels.reference_cross_entropy(F.linear(hb, wb).bfloat16().double(), t)
    assert kernels.relative_error(loss, ref) <= 1e-5 or method == "torch"
    assert kernels.relative_error(loss, ref) <= FWD_TOL[torch.bfloat16]
    h64, w64 = (a.double().requires_grad_(True) for a in (h, w))
    kernels.reference_cross_entropy(F.linear(h64, w64), t).backward()
    assert hh.grad.dtype == torch.float32 and ww.grad.dtype == torch.float32
    assert kernels.relative_error(hh.grad, h64.grad) <= 3 * FWD_TOL[torch.bfloat16]
    assert kernels.relative_error(ww.grad, w64.grad) <= 3 * FWD_TOL[torch.bfloat16]
    with pytest.raises((TypeError, RuntimeError), match="dtype"):
        kernels.linear_cross_entropy(h.bfloat16(), w, t, method=method)


@pytest.mark.parametrize("method", LINEAR_METHODS)
def test_tied_weights_in_the_model_match_the_logits_form(method, small_chunks):
    """The GPT's LM head is tied to its token embedding: the linear loss form gives the same loss and
    the same gradients (the tied weight's included) as the model's own eager logits form."""
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=37, context=8, n_layer=1, n_head=2, n_embd=16)).to(DEVICE)
    idx = torch.randint(0, 37, (3, 8), device=DEVICE)
    targets = idx.roll(-1, 1)
    targets[:, -1] = -100
    _, ref = model(idx, targets)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    applied = apply_accel(model, method, patch=["loss"], loss_form="linear")
    assert applied.loss in ("native", "composed") and model.lm_head.weight is model.wte.weight
    logits, loss = model(idx, targets)
    loss.backward()
    assert logits is None and abs(loss.item() - ref.item()) <= 1e-5 * ref.item()
    for n, p in model.named_parameters():
        assert kernels.relative_error(p.grad, ref_grads[n]) <= 1e-4, n


# ------------------------------------------------------------------------------------------------
# property test
# ------------------------------------------------------------------------------------------------
@st.composite
def ce_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    v = draw(st.integers(1, 80))
    dtype = draw(st.sampled_from(DTYPES))
    spread = draw(st.sampled_from([1e-3, 1.0, 5.0, 30.0] if dtype == torch.float32 else [1e-3, 1.0, 3.0]))
    reduction, p_ignore = draw(st.sampled_from(REDUCTIONS)), draw(st.floats(0.0, 1.0))
    return lead, v, dtype, spread, reduction, p_ignore, draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("method", [m for m in ("naive", "triton") if m in CE_METHODS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=ce_cases())
def test_property_random_shapes_values_and_ignored_targets(method, case):
    lead, v, dtype, spread, reduction, p_ignore, seed = case
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, v, generator=g) * spread).to(DEVICE, dtype)
    t = torch.randint(0, v, lead, generator=g)
    t[torch.rand(lead, generator=g) < p_ignore] = -100
    assert_matches(method, x, t.to(DEVICE), reduction=reduction)
