"""The softmax contract, for every method that can run here, against a float64 reference."""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.helpers import BWD_TOL, FWD_TOL, check_method, random_scores

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNNABLE = [m for m in kernels.runnable_methods(op="softmax") if not kernels.get_method(m).peer]
# compiling costs seconds per shape on a CPU: `compile` gets a representative subset there
FAST = [m for m in RUNNABLE if m != "compile" or DEVICE == "cuda"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_input(shape, layout, dtype, gen):
    if layout == "contiguous":
        return random_scores(shape, dtype, DEVICE, gen=gen)
    if layout == "transposed":  # last two dims swapped: leading dims do not flatten
        *lead, a, b = shape
        return random_scores((*lead, b, a), dtype, DEVICE, gen=gen).transpose(-1, -2)
    if layout == "strided":  # every other column
        *lead, n = shape
        return random_scores((*lead, 2 * n), dtype, DEVICE, gen=gen)[..., ::2]
    if layout == "sliced":  # rows longer than N: row stride > N
        *lead, n = shape
        return random_scores((*lead, n + 5), dtype, DEVICE, gen=gen)[..., 1 : n + 1]
    raise ValueError(layout)


CASES = [
    # (shape, causal, layout)
    ((1,), False, "contiguous"),  # N = 1, 1-D
    ((5, 1), False, "contiguous"),
    ((3, 7), False, "contiguous"),  # odd N
    ((2, 3, 33), False, "contiguous"),  # 3-D
    ((2, 2, 5, 64), False, "contiguous"),  # 4-D, power of two
    ((4, 127), False, "contiguous"),
    ((4, 129), False, "contiguous"),
    ((2, 1000), False, "contiguous"),
    ((2, 3, 16, 16), True, "contiguous"),  # causal Tq == Tk
    ((2, 5, 12), True, "contiguous"),  # causal Tq < Tk
    ((2, 12, 5), True, "contiguous"),  # causal Tq > Tk: fully masked rows
    ((3, 9, 9), True, "transposed"),
    ((4, 66), False, "strided"),
    ((3, 10, 40), True, "sliced"),
]


def _id(case):
    shape, causal, layout = case
    return f"{'x'.join(map(str, shape))}{'-causal' if causal else ''}-{layout}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("method", FAST)
def test_matches_float64_reference(method, case, dtype, seeded):
    shape, causal, layout = case
    x = make_input(shape, layout, dtype, seeded)
    fwd, bwd = check_method(method, x, scale=0.37, causal=causal)
    assert fwd <= FWD_TOL[dtype], f"forward error {fwd:.2e}"
    assert bwd <= BWD_TOL[dtype], f"backward error {bwd:.2e}"


COMPILE_CASES = [((3, 7), False, "contiguous"), ((2, 12, 5), True, "contiguous"), ((3, 9, 9), True, "transposed")]


@pytest.mark.skipif("compile" not in RUNNABLE, reason="torch.compile unavailable")
# (bfloat16: the same compiled graphs with a cast; each new graph compiles cold in CI: the slow set)
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", COMPILE_CASES, ids=_id)
def test_compile_matches_float64_reference(case, dtype, seeded):
    shape, causal, layout = case
    fwd, bwd = check_method("compile", make_input(shape, layout, dtype, seeded), scale=0.37, causal=causal)
    assert fwd <= FWD_TOL[dtype] and bwd <= BWD_TOL[dtype], (fwd, bwd)


@pytest.mark.skipif("compile" not in RUNNABLE, reason="torch.compile unavailable")
def test_compile_compiles_once_per_signature():
    from kernels.methods.compile import compiled_signatures

    x = torch.randn(4, 24, device=DEVICE)
    kernels.softmax(x, method="compile")
    before = compiled_signatures()
    for _ in range(3):  # same signature again: no new compile
        kernels.softmax(torch.randn(4, 24, device=DEVICE), method="compile")
    assert compiled_signatures() == before


@pytest.mark.parametrize("method", FAST)
def test_large_magnitudes_and_neg_inf_entries(method, seeded):
    x = torch.randn(6, 50, generator=seeded) * 1e4  # would overflow exp without the max shift
    x[0, :10] = float("-inf")
    x[1, 5] = float("-inf")
    y = kernels.softmax(x.to(DEVICE), scale=1.0, method=method)
    ref = kernels.reference_softmax(x, scale=1.0)
    assert torch.isfinite(y).all()
    assert kernels.relative_error(y, ref) <= 1e-5
    assert (y[0, :10] == 0).all()


# on a GPU also the lengths that take the fused kernels' persistent, cluster and split paths
HUGE_N = [64, 1000] + ([5000, 20000, 40000, 70000, 300000] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("n", HUGE_N)
@pytest.mark.parametrize("scale", [1.0, -0.5])
@pytest.mark.parametrize("method", [m for m in FAST if m != "compile" or DEVICE == "cuda"])
def test_huge_scores(method, scale, n):
    """Scores of 1e30 (x scale: the row's max, twice): the max is subtracted exactly, so the two share
    the row and nothing overflows (a fused exp2(fma(x, c, -round(max * c))) is shifted by the max's
    rounding error, ~1e22 here, and gives zeros or NaN)."""
    x = torch.full((1, n), -float("inf") if scale > 0 else float("inf"))  # x * scale = -inf
    x[0, 3], x[0, n - 2] = 1e30 * scale, 1e30 * scale
    y = kernels.softmax(x.to(DEVICE), scale=scale, method=method).cpu()
    assert y[0, 3].item() == 0.5 and y[0, n - 2].item() == 0.5 and y.sum().item() == 1.0


@pytest.mark.parametrize("method", [m for m in FAST if m != "torch"])
def test_all_neg_inf_row_gives_zeros(method):
    x = torch.randn(3, 17)
    x[1] = float("-inf")
    xg = x.to(DEVICE).requires_grad_(True)
    y = kernels.softmax(xg, method=method)
    y.sum().backward()
    assert (y[1] == 0).all() and torch.isfinite(y).all()
    assert (xg.grad[1] == 0).all()


@pytest.mark.parametrize("method", FAST)
def test_nan_propagates_within_its_row(method):
    x = torch.randn(3, 17)
    x[1, 4] = float("nan")
    y = kernels.softmax(x.to(DEVICE), method=method)
    assert torch.isnan(y[1]).all()
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()


@pytest.mark.parametrize("method", FAST)
def test_empty_leading_dims(method):
    x = torch.randn(0, 3, 8, device=DEVICE, requires_grad=True)
    y = kernels.softmax(x, method=method)
    assert y.shape == (0, 3, 8)


# -- the registry and its errors -----------------------------------------------------------------
def test_available_methods_lists_every_method_with_a_reason():
    avail = kernels.available_methods()
    assert {"naive", "torch", "compile", "triton", "cuda"} <= set(avail)
    for a in avail.values():
        assert a.available == (a.reason == ""), a
    assert avail["naive"].available and avail["torch"].available


def test_unknown_method_names_it_and_lists_runnable():
    with pytest.raises(kernels.UnknownMethodError) as e:
        kernels.softmax(torch.randn(2, 3), method="fastest")
    msg = str(e.value)
    assert "'fastest'" in msg and "naive" in msg and "runnable here" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_only_method_says_why_and_lists_runnable():
    with pytest.raises(kernels.MethodUnavailableError) as e:
        kernels.softmax(torch.randn(2, 3), method="cuda")
    msg = str(e.value)
    assert "'cuda'" in msg and "GPU" in msg and "torch" in msg


@pytest.mark.parametrize("method", FAST)
def test_rejects_integer_dtype(method):
    with pytest.raises(TypeError, match="dtype"):
        kernels.softmax(torch.ones(2, 3, dtype=torch.int64, device=DEVICE), method=method)


@pytest.mark.parametrize("method", FAST)
def test_rejects_empty_last_dim_and_0d(method):
    with pytest.raises(ValueError, match="empty last dimension"):
        kernels.softmax(torch.randn(3, 0, device=DEVICE), method=method)
    with pytest.raises(ValueError, match="0-d"):
        kernels.softmax(torch.tensor(1.0, device=DEVICE), method=method)
    with pytest.raises(ValueError, match="causal"):
        kernels.softmax(torch.randn(5, device=DEVICE), causal=True, method=method)


def test_registering_a_method_is_one_call_and_undoable():
    m = kernels.Method(name="_test_double", softmax=lambda x, s, c: 2 * x, summary="test")
    kernels.register(m)
    try:
        assert "_test_double" in kernels.available_methods()
        assert torch.equal(kernels.softmax(torch.ones(2), method="_test_double"), 2 * torch.ones(2))
    finally:
        kernels.unregister("_test_double")
    assert "_test_double" not in kernels.available_methods()


@pytest.mark.parametrize("method", FAST)
def test_pos_inf_makes_its_row_nan_as_torch_does(method):
    x = torch.randn(3, 9)
    x[2, 3] = float("inf")
    y = kernels.softmax(x.to(DEVICE), method=method)
    assert torch.isnan(y[2]).all() and torch.isnan(torch.softmax(x, -1)[2]).all()
    assert torch.isfinite(y[:2]).all()


@pytest.mark.parametrize("method", FAST)
def test_rejects_float64_with_the_supported_list(method):
    with pytest.raises(TypeError, match="float32, float16, bfloat16"):
        kernels.softmax(torch.randn(2, 3, dtype=torch.float64, device=DEVICE), method=method)
