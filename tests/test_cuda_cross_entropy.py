"""GPU tests (marked `gpu`, skipped without CUDA) of the `cuda` method's fused cross-entropy: the
primitives ce_rows / scale_grad_ (csrc/cross_entropy_binding.cpp; code paths: csrc/cross_entropy/paths.cuh)
on every code path against float64, the ops cross_entropy and linear_cross_entropy through the contract,
opcheck, full-graph compile, a second backward, no host sync, and the extra memory of the chunked
linear cross-entropy."""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import relative_error, tolerance
from tests.helpers import assert_never_synchronizes, ce_rows_reference

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
PATHS = {"auto": -1, "register": 0, "hybrid": 1, "split": 2, "stream": 3}


@pytest.fixture(scope="module", autouse=True)
def built():
    kernels.get_method("cuda").prepare()


def _gen(*key):  # (a stable seed per key: the same data in every run)
    return torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(key).encode()))


def _logits(rows, v, dtype, spread=3.0, key=0):
    g = _gen(rows, v, str(dtype), key)
    return (torch.randn(rows, v, device="cuda", generator=g) * spread).to(dtype)


def _targets(rows, v, ignore_index=-100, frac_ignored=0.1, key=0):
    g = _gen(rows, v, ignore_index, key)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    t[torch.rand(rows, device="cuda", generator=g) < frac_ignored] = ignore_index
    return t


def _rows_for(v, elements=2**24):
    return max(2, min(512, elements // v))


def assert_rows_match(loss, grad, x, t, ignore_index, scale=None):
    ref_loss, ref_grad = ce_rows_reference(x, t, ignore_index, scale)
    assert loss.dtype == torch.float32 and loss.shape == (x.shape[0],)
    assert not torch.isnan(loss).any() and not torch.isnan(grad).any(), "NaN in the loss or gradient"
    err = ((loss.double() - ref_loss).abs() / ref_loss.abs().clamp(min=1.0)).max().item()
    assert err <= 2e-5, f"loss error {err:.2e}"
    if grad is not None:
        gerr, tol = relative_error(grad, ref_grad), tolerance("fwd", x.dtype, ref_grad)
        assert gerr <= tol, f"gradient error {gerr:.2e} > {tol:.2e}"
        assert (grad[t == ignore_index] == 0).all(), "ignored rows must get a zero gradient"


def check_op(x, t, ignore_index=-100, reduction="mean", weight=None):
    """kernels.cross_entropy(method='cuda') forward + backward against float64 (x in any layout)."""
    xr = x.detach().requires_grad_(True)
    loss = kernels.cross_entropy(xr, t, method="cuda", ignore_index=ignore_index, reduction=reduction)
    x64 = x.detach().double().requires_grad_(True)
    ref = F.cross_entropy(x64.reshape(-1, x.shape[-1]), t.reshape(-1), ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        ref = ref.view(t.shape)
    elif reduction == "mean" and bool((t == ignore_index).all()):
        ref = (x64 * 0).sum()  # the contract: 0 (torch gives NaN)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    if weight is None:
        weight = torch.randn(ref.shape, device="cuda", dtype=torch.float64) if reduction == "none" else torch.tensor(
            1.0, device="cuda", dtype=torch.float64)
    (loss * weight.float()).sum().backward()
    (ref * weight).sum().backward()
    assert torch.isfinite(loss).all() and not torch.isnan(xr.grad).any()
    lerr = ((loss.double() - ref.detach()).abs() / ref.detach().abs().clamp(min=1.0)).max().item()
    assert lerr <= 2e-5, f"loss error {lerr:.2e}"
    gerr, tol = relative_error(xr.grad, x64.grad), tolerance("fwd", x.dtype, x64.grad)
    assert gerr <= tol or x64.grad.abs().max() == 0, f"gradient error {gerr:.2e} > {tol:.2e}"
    assert (xr.grad[t == ignore_index] == 0).all()
    return xr.grad


VOCABS = [1, 7, 127, 128, 129, 1000, 4095, 4096, 4097, 8192, 16384, 16385, 32768, 32769, 50304, 65536, 65544, 128256,
          262144, 300000]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("v", VOCABS)
def test_matches_float64_across_vocabularies(v, dtype):
    rows = _rows_for(v)
    check_op(_logits(rows, v, dtype), _targets(rows, v), reduction="sum")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("v", [129, 4096, 50304, 128256])
def test_each_reduction(v, reduction, dtype):
    rows = min(64, _rows_for(v))
    check_op(_logits(rows, v, dtype), _targets(rows, v), reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_leading_dimensions(reduction):
    x = _logits(2 * 3 * 17, 1000, torch.bfloat16).view(2, 3, 17, 1000)
    t = _targets(2 * 3 * 17, 1000).view(2, 3, 17)
    check_op(x, t, reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("v", [100, 50304, 262144])
def test_ignored_targets(v, dtype):
    rows = min(64, _rows_for(v))
    x = _logits(rows, v, dtype)
    check_op(x, _targets(rows, v, frac_ignored=0.5))
    for ignore_index in (0, 5 % v, v - 1):  # an ignore_index that is also a class
        check_op(x, _targets(rows, v, ignore_index=ignore_index, frac_ignored=0.3), ignore_index=ignore_index)
    for reduction in ("mean", "sum", "none"):  # every target ignored: loss 0 and a zero gradient, never NaN
        xr = x.detach().requires_grad_(True)
        loss = kernels.cross_entropy(xr, torch.full((rows,), -100, device="cuda"), method="cuda", reduction=reduction)
        loss.sum().backward()
        assert (loss == 0).all() and (xr.grad == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("layout", ["row-padded", "row-padded-odd", "column-strided", "misaligned"])
def test_strided_logits(layout, dtype):
    rows, v = 37, 5000
    wide = _logits(rows, v + 24, dtype)
    if layout == "row-padded":  # row stride v + 24 (16-byte multiple): the vector paths
        x = wide[:, :v]
    elif layout == "row-padded-odd":  # row stride v + 1: the stream path
        x = _logits(rows, v + 1, dtype)[:, :v]
    elif layout == "column-strided":  # copied once by the binding
        x = _logits(v, rows, dtype).t()
    else:  # base pointer off by one element
        x = wide[:, 1:v + 1]
    check_op(x, _targets(rows, v))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("v", [129, 8192, 50304, 262144])
def test_large_and_minus_inf_logits(v, dtype):
    rows = min(32, _rows_for(v))
    t = _targets(rows, v, frac_ignored=0.0)
    big = _logits(rows, v, torch.float32, spread=1.0) + 1e4  # no overflow at 1e4
    big[torch.arange(rows), t] += 3.0
    check_op(big.to(dtype), t)
    # -inf off the target: whole rows (the target alone: loss 0) and half of each row
    x = _logits(rows, v, torch.float32)
    off = torch.ones(rows, v, dtype=torch.bool, device="cuda")
    off[torch.arange(rows), t] = False
    off[1::2] &= torch.rand(rows // 2, v, device="cuda", generator=_gen(v)) < 0.5
    x = x.masked_fill(off, float("-inf")).to(dtype)
    grad = check_op(x, t)
    assert (grad[off] == 0).all()
    loss = kernels.cross_entropy(x[0::2], t[0::2], method="cuda", reduction="none")
    assert (loss == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("path,v", [("register", 8), ("register", 1000), ("register", 16384), ("register", 32768),
                                    ("hybrid", 1000), ("hybrid", 40000), ("hybrid", 50304), ("hybrid", 65536),
                                    ("split", 16), ("split", 4096), ("split", 20000), ("split", 50304),
                                    ("split", 128256), ("stream", 1), ("stream", 7), ("stream", 1000),
                                    ("stream", 50304), ("stream", 262144), ("stream", 300000)])
def test_forced_paths(path, v, dtype):
    """Every code path through the primitive, the gradient buffer poisoned with NaN (an element a path
    misses stays NaN), scale 1 / n_valid, and the same again in place (the gradient over the logits)."""
    from kernels.methods.cuda import ce_code_path

    if ce_code_path(dtype, v, path=path) == "none":
        pytest.skip(f"the {path} path does not take {IDS[dtype]} rows of {v}")
    rows = min(48, _rows_for(v))
    x, t = _logits(rows, v, dtype), _targets(rows, v)
    inv = (t != -100).sum().clamp(min=1).float().reciprocal()
    grad = torch.full_like(x, float("nan"))
    loss = torch.ops.softmax_harness_cuda.ce_rows(x, t, -100, inv, grad, PATHS[path])
    assert_rows_match(loss, grad, x, t, -100, inv)
    again = torch.ops.softmax_harness_cuda.ce_rows(x, t, -100, inv, grad, PATHS[path])
    assert torch.equal(again, loss), "not deterministic"
    y = x.clone()
    loss2 = torch.ops.softmax_harness_cuda.ce_rows(y, t, -100, inv, y, PATHS[path])
    assert torch.equal(loss2, loss) and torch.equal(y, grad), "in place differs"
    per_row = torch.rand(rows, device="cuda", generator=_gen(v, 1)) + 0.5
    loss3 = torch.ops.softmax_harness_cuda.ce_rows(x, t, -100, per_row, grad, PATHS[path])
    assert_rows_match(loss3, grad, x, t, -100, per_row)
    only = torch.ops.softmax_harness_cuda.ce_rows(x, t, -100, None, None, PATHS[path])  # losses only
    assert torch.equal(only, loss)


def test_code_paths_by_vocabulary():
    from kernels.methods.cuda import ce_code_path

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cap = min(128, sms)
    expected = {
        torch.bfloat16: {1: "stream", 8: "register", 32768: "register", 32776: "hybrid", 50304: "hybrid",
                         65536: "hybrid", 65544: "split", 128256: "split", 262144: "split",
                         cap * 65536: "split", cap * 65536 + 8: "stream"},  # 512 x (64 + 64)-column slices
        torch.float32: {4: "register", 16384: "register", 16388: "split", 50304: "split", cap * 8192: "split",
                        cap * 8192 + 4: "stream"},
    }
    for dtype, paths in expected.items():
        for v, path in paths.items():
            aligned = v % (16 // torch.empty((), dtype=dtype).element_size()) == 0
            assert ce_code_path(dtype, v, aligned=aligned) == path, (dtype, v)
    assert ce_code_path(torch.bfloat16, 50304, aligned=False) == "stream"
    assert ce_code_path(torch.float32, 50304, path="hybrid") == "none"


@pytest.mark.parametrize("path", ["register", "split", "stream"])
def test_out_of_range_targets_are_an_error_on_the_device(path):
    from kernels.methods.cuda import check_targets

    v = {"register": 1000, "split": 50304, "stream": 1001}[path]
    rows = 16
    x, t = _logits(rows, v, torch.bfloat16), _targets(rows, v, frac_ignored=0.0)
    check_targets()  # (a clean record)
    for bad in (v, -5):
        t2 = t.clone()
        t2[3] = bad
        grad = torch.zeros_like(x)
        loss = torch.ops.softmax_harness_cuda.ce_rows(x, t2, -100, None, grad, PATHS[path])
        assert torch.isnan(loss[3]) and torch.isnan(grad[3]).all()
        ok = torch.ones(rows, dtype=torch.bool, device="cuda")
        ok[3] = False
        assert torch.isfinite(loss[ok]).all() and torch.isfinite(grad[ok]).all()
        with pytest.raises(RuntimeError, match=f"target {bad} \\(row 3\\) is outside \\[0, {v}\\)"):
            check_targets()
        check_targets()  # the record was cleared
    loss = kernels.cross_entropy(x, torch.full((rows,), v, device="cuda"), method="cuda")
    assert torch.isnan(loss)
    with pytest.raises(RuntimeError, match="outside"):
        check_targets()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
def test_scale_grad(dtype):
    sg = torch.ops.softmax_harness_cuda.scale_grad_
    for shape in [(33, 1000), (4, 50304), (3, 7), (1, 300001)]:
        g = _logits(*shape, dtype)
        keep = g.clone()
        sg(g, torch.ones((), device="cuda"))
        assert torch.equal(g, keep), "g = 1 must leave the gradient untouched"
        sg(g, torch.full((1,), 0.5, device="cuda"))
        assert torch.equal(g, (keep.float() * 0.5).to(dtype))
        g = keep.clone()
        s = torch.rand(shape[0], device="cuda", generator=_gen(*shape)) + 0.5
        s[0] = 1.0  # a row whose scale is exactly 1 is skipped, the others scaled
        sg(g, s)
        assert torch.equal(g, (keep.float() * s[:, None]).to(dtype))
    wide = _logits(8, 1024 + 8, dtype)
    g = wide[:, :1024]  # strided rows
    keep = g.clone()
    sg(g, torch.full((8,), 2.0, device="cuda"))
    assert torch.equal(g, (keep.float() * 2).to(dtype))
    assert torch.equal(wide[:, 1024:], _logits(8, 1024 + 8, dtype)[:, 1024:])  # the padding untouched


def test_backward_scales_by_grad_output():
    x, t = _logits(64, 3000, torch.bfloat16), _targets(64, 3000)
    for reduction, w in (("mean", torch.tensor(3.5, device="cuda", dtype=torch.float64)), ("sum", None),
                         ("none", None)):
        check_op(x, t, reduction=reduction, weight=w)
    xr = x.detach().requires_grad_(True)  # grad_output exactly 1: the backward only launches the skip
    kernels.cross_entropy(xr, t, method="cuda").backward()
    _, ref = ce_rows_reference(x, t, -100, (t != -100).sum().float().reciprocal())
    assert relative_error(xr.grad, ref) <= tolerance("fwd", torch.bfloat16, ref)


def test_second_backward_through_the_same_graph_raises():
    xr = _logits(16, 500, torch.float32).requires_grad_(True)
    loss = kernels.cross_entropy(xr, _targets(16, 500), method="cuda")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_opchecks():
    from kernels.methods.cuda.cross_entropy import cuda_cross_entropy, cuda_linear_cross_entropy

    x, t = _logits(24, 1000, torch.bfloat16), _targets(24, 1000)
    inv = torch.tensor(0.25, device="cuda")
    ce_rows = torch.ops.softmax_harness_cuda.ce_rows.default
    torch.library.opcheck(ce_rows, (x, t, -100, inv, torch.empty_like(x), -1))
    torch.library.opcheck(ce_rows, (x, t, -100, torch.rand(24, device="cuda"), torch.empty_like(x), 2))
    torch.library.opcheck(ce_rows, (x, t, -100, None, None, -1))
    sg = torch.ops.softmax_harness_cuda.scale_grad_.default
    torch.library.opcheck(sg, (x.clone(), torch.tensor(0.5, device="cuda")))
    torch.library.opcheck(sg, (x.clone(), torch.rand(24, device="cuda")))
    (ce_fwd,) = cuda_cross_entropy.ops
    for reduction in ("mean", "sum", "none"):
        torch.library.opcheck(ce_fwd, (x, t, -100, reduction, True))
    torch.library.opcheck(ce_fwd, (x, t, -100, "mean", False))
    lce_fwd, lce_bwd = cuda_linear_cross_entropy.ops
    h, w = _logits(24, 64, torch.bfloat16), _logits(1000, 64, torch.bfloat16, spread=0.1)
    for reduction in ("mean", "sum", "none"):
        torch.library.opcheck(lce_fwd, (h, w, t, -100, reduction, 8, True, True))
    torch.library.opcheck(lce_bwd, (h, w, t, -100, torch.rand(24, device="cuda"), 8, True, True))


@pytest.mark.slow
def test_fullgraph_compile_equals_eager():
    x, t = _logits(96, 4000, torch.bfloat16), _targets(96, 4000, frac_ignored=0.3)
    h, w = _logits(96, 64, torch.float32), _logits(4000, 64, torch.float32, spread=0.1)

    ce = kernels.bind("cuda", "cross_entropy")
    lce = kernels.bind("cuda", "linear_cross_entropy")

    def f(x, h, w):
        return (ce(x, t, -100, "mean") + ce(x, t, -100, "none").sum() * 0.5 + ce(x, t, -100, "sum") * 0.01
                + lce(h, w, t, -100, "mean"))

    def run(fn):
        args = [a.detach().requires_grad_(True) for a in (x, h, w)]
        out = fn(*args)
        out.backward()
        return out, [a.grad for a in args]

    eager, eg = run(f)
    compiled, cg = run(torch.compile(f, fullgraph=True))
    assert torch.allclose(compiled, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(cg, eg):  # (x's three bf16 gradients may be summed in another order or precision)
        assert relative_error(a, b) <= (1e-2 if a.dtype == torch.bfloat16 else 1e-5)


@pytest.mark.slow
def test_compiled_second_backward_raises_or_is_correct():
    xr = _logits(16, 500, torch.float32).requires_grad_(True)
    t = _targets(16, 500)
    fn = torch.compile(lambda z: kernels.cross_entropy(z, t, method="cuda"), fullgraph=True)
    loss = fn(xr)
    try:
        loss.backward(retain_graph=True)
        first = xr.grad.clone()
        loss.backward()
    except RuntimeError as exc:  # torch refuses retain_graph with donated buffers; or ours
        assert "donated" in str(exc) or "second backward" in str(exc)
    else:
        assert torch.allclose(xr.grad, 2 * first)


def test_no_host_sync():
    x, t = _logits(256, 50304, torch.bfloat16), _targets(256, 50304)
    h, w = _logits(256, 64, torch.bfloat16), _logits(50304, 64, torch.bfloat16, spread=0.1)
    xr, hr, wr = (a.detach().requires_grad_(True) for a in (x, h, w))

    def step():
        kernels.cross_entropy(xr, t, method="cuda").backward()
        kernels.cross_entropy(xr, t, method="cuda", reduction="none").sum().backward()
        kernels.linear_cross_entropy(hr, wr, t, method="cuda").backward()

    assert_never_synchronizes(step)  # (the warm-up call builds, runs the one-time accumulate probe)


def _ref_lce(h, w, t, ignore_index, reduction):
    h64, w64 = (a.detach().double().requires_grad_(True) for a in (h, w))
    ref = F.cross_entropy(F.linear(h64, w64), t, ignore_index=ignore_index, reduction=reduction)
    return h64, w64, ref


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("n,c,v,chunk", [(300, 64, 1000, 64), (257, 32, 50304, None), (64, 48, 4097, 7)])
def test_linear_cross_entropy_matches_linear_then_cross_entropy(n, c, v, chunk, reduction, dtype):
    from kernels.methods.cuda import cuda_linear_cross_entropy

    h = _logits(n, c, dtype, spread=1.0).requires_grad_(True)
    w = _logits(v, c, dtype, spread=0.2).requires_grad_(True)
    t = _targets(n, v)
    loss = cuda_linear_cross_entropy(h, w, t, -100, reduction, chunk)
    h64, w64, ref = _ref_lce(h, w, t, -100, reduction)
    g = torch.randn(ref.shape, device="cuda", dtype=torch.float64) if reduction == "none" else torch.tensor(
        0.7, device="cuda", dtype=torch.float64)
    (loss * g.float()).sum().backward()
    (ref * g).sum().backward()
    lerr = ((loss.double() - ref.detach()).abs() / ref.detach().abs().clamp(min=1.0)).max().item()
    assert lerr <= {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype], lerr
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    assert relative_error(h.grad, h64.grad) <= tol
    assert relative_error(w.grad, w64.grad) <= tol


def test_linear_cross_entropy_tied_weights_and_autocast():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 64).cuda()  # fp32 parameters, tied input and output embedding
    idx = torch.randint(0, 1000, (4, 128), device="cuda")
    t = _targets(4 * 128, 1000).view(4, 128)

    def loss_of(lce):
        emb.zero_grad()
        with torch.autocast("cuda", torch.bfloat16):
            hidden = torch.tanh(emb(idx) @ torch.ones(64, 64, device="cuda") * 0.05)
            loss = lce(hidden, emb.weight, t)
        loss.backward()
        return loss.float(), emb.weight.grad.clone()

    mine, g_mine = loss_of(lambda h, w, t: kernels.linear_cross_entropy(h, w, t, method="cuda"))
    ref, g_ref = loss_of(lambda h, w, t: F.cross_entropy(F.linear(h, w).float().flatten(0, 1), t.flatten()))
    assert g_mine.dtype == torch.float32
    assert abs(mine.item() - ref.item()) <= 1e-2 * abs(ref.item())
    assert relative_error(g_mine, g_ref) <= 3e-2


def test_linear_cross_entropy_extra_memory_at_the_lm_head_shape():
    """16384 x 768 hidden, 50304 x 768 weight, bf16: forward + backward allocate at most 0.5 GiB beyond the
    inputs (the chunk of logits, the float32 weight gradient, the gradients handed back)."""
    n, c, v = 16384, 768, 50304
    h = _logits(n, c, torch.bfloat16, spread=1.0).requires_grad_(True)
    w = _logits(v, c, torch.bfloat16, spread=0.05).requires_grad_(True)
    t = _targets(n, v)
    kernels.linear_cross_entropy(h, w, t, method="cuda").backward()  # warm-up: cuBLAS workspaces, the probe
    h.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = kernels.linear_cross_entropy(h, w, t, method="cuda")
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= 0.5 * 2**30, f"{extra / 2**30:.3f} GiB"
    assert math.isfinite(loss.item())


# Each input check of the raw op with the message it must raise. In a child process: a check that
# crashed (run R: every message formatting an integer died in a libstdc++ copy the extension exported,
# kernels/methods/cuda/build.py LDFLAGS) fails this test instead of ending the test session.
_CHECKS = """
import torch, kernels
kernels.get_method("cuda").prepare()
op = torch.ops.softmax_harness_cuda.ce_rows
x = torch.randn(4, 70000, device="cuda"); t = torch.zeros(4, dtype=torch.long, device="cuda")
cases = {"forced path": (x, t, -100, None, None, 0), "path range": (x, t, -100, None, None, 7),
         "scale shape": (x, t, -100, torch.ones(3, device="cuda"), None, -1),
         "targets shape": (x, t[:3], -100, None, None, -1), "grad dtype": (x, t, -100, None, x.half(), -1),
         "targets dtype": (x, t.float(), -100, None, None, -1)}
for name, args in cases.items():
    try:
        op(*args)
        print(name, "| no error")
    except RuntimeError as e:
        print(name, "|", str(e).splitlines()[0])
"""
_MESSAGES = {"forced path": "the forced path 0 cannot take these rows (4 x 70000, Float",
             "path range": "path 7 is not one of -1..3",
             "scale shape": "grad_scale must be a scalar or (N,) = (4,), got [3]",
             "targets shape": "targets must be (N,) = (4",
             "grad dtype": "grad must have the logits' dtype Float, got Half",
             "targets dtype": "targets must be int64 (or int32), got Float"}


def test_input_checks_raise_with_their_numbers():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # the child imports kernels from this checkout
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _CHECKS], capture_output=True, text=True, timeout=600, cwd=root,
                          env=env)
    assert proc.returncode == 0, f"the checks' process died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    got = dict(line.split(" | ", 1) for line in proc.stdout.splitlines() if " | " in line)
    for name, message in _MESSAGES.items():
        assert message in got.get(name, "(nothing printed)"), f"{name}: {got.get(name)!r}"


def test_rejects_cpu_tensors():
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        kernels.cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), method="cuda")
    x = _logits(4, 8, torch.float32)
    with pytest.raises(RuntimeError, match="targets on cpu"):
        torch.ops.softmax_harness_cuda.ce_rows(x, torch.zeros(4, dtype=torch.long), -100, None, None)
    with pytest.raises(RuntimeError, match="cannot take these rows"):
        torch.ops.softmax_harness_cuda.ce_rows(_logits(4, 70000, torch.float32), torch.zeros(4, dtype=torch.long,
                                                                                                device="cuda"),
                                               -100, None, None, 0)
