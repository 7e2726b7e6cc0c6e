"""Property-based tests (hypothesis): every runnable method against the float64 reference over random
shapes, dtypes, scales, causal offsets and value ranges."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels
from tests.helpers import assert_close_to_reference, rounding_floor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
METHODS = [m for m in kernels.runnable_methods(op="softmax") if not kernels.get_method(m).peer]
# compiling each new shape takes seconds on a CPU
EXAMPLES = {"compile": 5 if DEVICE == "cpu" else 25}
DEFAULT_EXAMPLES = 60
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@st.composite
def cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    causal = draw(st.booleans())
    tq = draw(st.integers(1, 12)) if causal else draw(st.integers(1, 5))
    tk = draw(st.integers(1, 40))
    dtype = draw(st.sampled_from(DTYPES))
    scale = draw(st.sampled_from([1.0, 0.125, 0.5, 2.0, -0.7]))
    # fp32 takes large magnitudes; 16-bit types are checked where rounding the scores is not the story
    spreads = [1e-3, 1.0, 5.0, 100.0] if dtype == torch.float32 else [1e-3, 1.0, 3.0]
    spread = draw(st.sampled_from(spreads))
    seed = draw(st.integers(0, 2**31 - 1))
    return (*lead, tq, tk), causal, dtype, scale, spread, seed


def _run(method, case):
    shape, causal, dtype, scale, spread, seed = case
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * spread).to(device=DEVICE, dtype=dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(device=DEVICE, dtype=dtype)
    y = kernels.softmax(x, scale=scale, causal=causal, method=method)
    y.backward(dy)
    if method == "torch":
        # `torch` scales in the input dtype, as user code does: its reference is the softmax of the
        # scaled scores rounded to that dtype (documented in docs/reliability.md)
        x64 = (x.detach() * scale).to(torch.float64).requires_grad_(True)
        ref = kernels.reference_softmax(x64, scale=1.0, causal=causal)
        ref.backward(dy.to(torch.float64))
        ref_grad = x64.grad * scale
    else:
        x64 = x.detach().to(torch.float64).requires_grad_(True)
        ref = kernels.reference_softmax(x64, scale=scale, causal=causal)
        ref.backward(dy.to(torch.float64))
        ref_grad = x64.grad
    assert y.shape == x.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any() and not torch.isnan(x.grad).any()
    fwd = _err(y, ref, dtype)
    # backward rounding scales with |scale| * |y| * |dy| even where the exact gradient cancels to ~0
    # (a peaked row: dy_i - sum(y dy) is a difference of nearly equal numbers)
    grad_scale = abs(scale) * ref.detach().norm().item() * dy.abs().max().item()
    bwd = _err(x.grad, ref_grad, dtype, extra_floor=grad_scale)
    assert_close_to_reference(fwd, bwd, (rounding_floor(ref.detach(), dtype), rounding_floor(ref_grad, dtype)), dtype)
    if causal:
        tq, tk = shape[-2], shape[-1]
        masked = torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1).to(DEVICE)
        assert (y.detach()[..., masked] == 0).all() and (x.grad[..., masked] == 0).all()


def _err(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, extra_floor: float = 0.0) -> float:
    """||out - ref|| / max(||ref||, floor): values far below the dtype's resolution (a gradient made of
    exp(-100) terms, say) count in absolute terms, not relative ones."""
    floor = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype] * ref.numel() ** 0.5
    diff = (out.detach().to(torch.float64).cpu() - ref.detach().cpu()).norm().item()
    return diff / max(ref.detach().norm().item(), floor, extra_floor)


# compile: a fresh compile per new shape (~20 s on two cores): in the slow set
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m == "compile" else m for m in METHODS])
def test_matches_reference_on_random_cases(method):
    @settings(max_examples=EXAMPLES.get(method, DEFAULT_EXAMPLES), deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def check(case):
        _run(method, case)

    check()
