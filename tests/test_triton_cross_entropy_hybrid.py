"""The Triton cross-entropy's hybrid path (``cross_entropy_gluon._ce_hybrid_kernel``, a Gluon kernel, GPU
only): it compiles for sm_90 with its buffer at the start of shared memory and no spill of the row (no
GPU needed), when it may run (``hybrid_unusable``), the plan and the sweep's candidates; on a GPU,
forced against float64.

On a CPU the launches run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py), where the
hybrid path is never taken."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.runtime import availability
from tests.compiled_report import check_hybrid_layout, compile_cases
from tests.helpers import ce_rows_reference
from tests.test_cross_entropy import DEVICE

pytestmark = [pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture
def cg():
    from kernels.methods.triton.cross_entropy import gluon as cross_entropy_gluon

    return cross_entropy_gluon


_COMPILE = r"""
import json, sys
from tests.compiled_report import compile_gluon_sm90, report
from kernels.methods.triton.cross_entropy import gluon as cg
from kernels.methods.triton.softmax import plan as tp

for case in sys.argv[1:]:
    dtype, v, grad, warps = case.split(":")
    v, grad, warps = int(v), grad == "1", int(warps)
    P = f"*{dtype}"
    sig = {"X": P, "T": "*i64", "LOSS": "*fp32", "G": P, "S": "*fp32", "C": "*fp32", "XW": "*i32", "GW": "*i32",
           "n_vec": "i32", "stride_v": "i32", "stride_gv": "i32", "stride_s": "i32", "ignore_index": "i32", "zero": "i32"}
    nr, ns, even = tp._hybrid_shape(v, cg._softmax_plan(warps))
    const = {"NR": nr, "NS": ns, "EVEN": even, "BF16": dtype == "bf16", "FROM_S": grad, "DIVIDE": True,
             "WRITE_LOSS": True, "WRITE_GRAD": grad}
    k = compile_gluon_sm90(cg._ce_hybrid_kernel, sig, const, (0, 3, 6, 7), warps, cg.hybrid_maxnreg(warps))
    print(json.dumps({"case": case, "ns": ns, **report(k)}))
"""


@pytest.mark.slow  # a cold sm_90 compile: ~17 s on two cores (CI starts cold)
def test_hybrid_kernel_compiles_for_sm90_with_its_buffer_at_the_start_of_shared_memory(cg):
    """bf16 and fp16, with and without the gradient, a whole and a partial shared part, 16 and 8 warps (the
    default):
    compiled for Hopper (sm_90; ptxas ships with Triton) in a subprocess without TRITON_INTERPRET. The
    shared part lies at offset 0 (where the inline cp.async addresses it: constant offsets below its
    end are its slots, the reductions' scratch lies past it while the part is live), two programs fit an H200 SM at 16
    warps, registers within maxnreg, nothing in local memory, and at most a pointer or two on the
    stack (the scheduler's; a shared part held in registers across passes takes hundreds of bytes).
    Without the gradient the kernel only reads the logits (no vector stores)."""
    if availability.GLUON_ERROR:
        pytest.skip(availability.GLUON_ERROR)
    cases = ["bf16:65536:1:16", "fp16:50304:1:16", "bf16:50304:0:16", "fp16:65536:0:16", "bf16:50304:1:8",
             "fp16:65536:1:8"]
    for r in compile_cases(_COMPILE, cases, timeout=600):
        dtype, v, grad, warps = r["case"].split(":")
        check_hybrid_layout(r, int(warps), grad == "1", cg.hybrid_maxnreg(int(warps)))
        if warps == "16":  # two programs an H200 SM
            assert r["shared"] <= 227 * 1024 // 2, r["case"]


class _FakeRows:
    """What hybrid_unusable asks of a tensor, for a GPU tensor on a machine without one."""

    def __init__(self, v, stride0=None, ptr=0, dtype=torch.bfloat16, col_stride=1):
        self.shape, self.dtype, self.is_cuda, self.device = (4, v), dtype, True, torch.device("cuda", 0)
        self._strides, self._ptr = (v if stride0 is None else stride0, col_stride), ptr

    def stride(self, i):
        return self._strides[i]

    def element_size(self):
        return torch.empty((), dtype=self.dtype).element_size()

    def data_ptr(self):
        return self._ptr


def test_hybrid_unusable_reasons(cg, monkeypatch):
    """The interpreter, a CPU tensor, the row length, the dtype, alignment (rows, row stride, column
    stride, address; logits and gradient), shared memory; None where it can run. (Causal rows are no
    cross-entropy case: nothing to check.)"""
    x = torch.zeros(2, 50304, dtype=torch.bfloat16)
    if availability.GLUON_ERROR:
        assert cg.hybrid_unusable(x, x) is not None
        return
    monkeypatch.setattr(cg, "interpreter_enabled", lambda: True)
    assert "interpreter" in cg.hybrid_unusable(x, x)
    monkeypatch.setattr(cg, "interpreter_enabled", lambda: False)
    assert "GPU only" in cg.hybrid_unusable(x, None)
    props = SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=227 * 1024, multi_processor_count=132)
    monkeypatch.setattr(tp, "device_props", lambda device: props)
    for v in (50304, 16392, 32768, 40000, 65536):
        assert cg.hybrid_unusable(_FakeRows(v), _FakeRows(v)) is None, v
        assert cg.hybrid_unusable(_FakeRows(v), None, num_warps=8) is None, v
    for v in (16384, 8192, 65544, 128256):
        assert "rows of 16385 to 65536 columns" in cg.hybrid_unusable(_FakeRows(v), None), v
    assert "16-bit" in cg.hybrid_unusable(_FakeRows(50304, dtype=torch.float32), None)
    assert "dtype" in cg.hybrid_unusable(_FakeRows(50304), _FakeRows(50304, dtype=torch.float16))
    for bad in (_FakeRows(50300), _FakeRows(50304, stride0=50308), _FakeRows(50304, ptr=2),
                _FakeRows(50304, col_stride=2)):
        assert "16-byte aligned" in cg.hybrid_unusable(bad, None)
        assert "16-byte aligned" in cg.hybrid_unusable(_FakeRows(50304), bad)
    assert cg.hybrid_unusable(_FakeRows(50304, stride0=50304 + 64), None) is None  # a 16-byte aligned column slice
    props.major = 7
    assert "cp.async" in cg.hybrid_unusable(_FakeRows(50304), None)
    props.major, props.shared_memory_per_block_optin = 9, 64 * 1024
    assert "shared memory" in cg.hybrid_unusable(_FakeRows(65536), None)


def test_plan_takes_the_hybrid_path_exactly_in_its_range(ck):
    assert ck.LONG_PATH == "hybrid"  # (the default: measured ahead of the stream path)
    for v in (16385, 16392, 32768, 40000, 50304, 65536):
        assert ck.plan(v) == ck.Plan("hybrid", ck._next_pow2(v), 1, ck.HYBRID_CE_WARPS), v
        assert ck.plan(v, elem_bytes=4).path == ck.plan(v, hybrid=False).path == "stream", v
    assert ck.plan(16384).path == "tile" and ck.plan(65537).path == "stream"  # (65537: not 16-byte rows)
    assert ck.plan(262144).path == "slices"  # (longer rows: tests/test_triton_cross_entropy_slices.py)


def test_launch_falls_back_where_the_hybrid_path_cannot_run(ck, monkeypatch):
    """With LONG_PATH = "hybrid" (shrunk: rows of 17-64 columns) the interpreter's rows take the stream
    path and match float64; a hybrid plan asked for by name is an error, not another path."""
    monkeypatch.setattr(ck, "LONG_PATH", "hybrid")
    monkeypatch.setattr(ck, "TILE_MAX_N", 16)
    monkeypatch.setattr(ck, "HYBRID_MIN_N", 16)
    monkeypatch.setattr(ck, "HYBRID_MAX_N", 64)
    monkeypatch.setattr(ck, "STREAM_BLOCK_N", 8)
    assert ck.plan(40).path == "hybrid"
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)).to(DEVICE, torch.bfloat16)
    t = torch.tensor([1, -100, 39], device=DEVICE)
    rows, count, grad = ck.forward(x, t, -100, "sum", True)
    x64 = x.double().requires_grad_(True)
    ref = kernels.reference_cross_entropy(x64, t, reduction="none")
    ref.sum().backward()
    assert kernels.relative_error(rows, ref) <= 1e-5 and kernels.relative_error(grad, x64.grad) <= 1e-2
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="hybrid path"):
            ck.forward(x, t, -100, "sum", True, p=ck.Plan("hybrid", 64, 1, 16))


def test_sweep_candidates_include_the_hybrid_path_only_where_usable(ck, monkeypatch):
    from harness.bench.tuning.triton_ce_sweep import candidates

    hybrid = [ck.Plan("hybrid", 65536, 1, 8), ck.Plan("hybrid", 65536, 1, 16)]
    c = candidates(50304)  # (default: nothing is usable; the current plan is the one launch_ce falls back to)
    assert c[0] == ck.plan(50304, hybrid=False) and all(p.path != "hybrid" for p in c)
    c = candidates(50304, lambda p: True)  # the default plan itself (8 warps) first, listed once
    assert c[:2] == hybrid and len(set(c)) == len(c)
    assert [p for p in candidates(50304, lambda p: p.num_warps == 16) if p.path == "hybrid"] == hybrid[1:]
    assert all(p.path != "hybrid" for v in (65544, 128256) for p in candidates(v, lambda p: True))
    assert candidates(16384, lambda p: True) == [ck.plan(16384)]
    monkeypatch.setattr(ck, "LONG_PATH", "stream")  # another default: the hybrid plans after it
    c = candidates(50304, lambda p: True)
    assert c[0] == ck.plan(50304) and c[1:3] == hybrid[::-1] and len(set(c)) == len(c)


# ------------------------------------------------------------------------------------------------
# GPU (skipped without one)
# ------------------------------------------------------------------------------------------------
def _err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp(min=1e-300)).item()


def _grad_bound(ref_grad, after, dtype):
    """3x the error of rounding the exact gradient to dtype the way the op does: the forward writes the
    gradient in dtype and the backward multiplies it by ``after`` (0-dim or one per row), a second
    rounding: grad_output, or grad_output / n_valid where the forward leaves the mean's 1 / n_valid to
    the backward (float16: ``_after``). Whichever of one or two roundings errs more: with a factor of 1
    there is one, and a lucky grad_output can make the single rounding of the product small (run R: 6.2e-4
    for one rounding, 3.8e-3 measured, 2.0e-3 for the two roundings at grad_output 1.25)."""
    ab = after.reshape(-1, 1) if after.dim() else after
    once = _err(ref_grad.to(dtype), ref_grad)
    twice = _err(((ref_grad / ab).to(dtype).double() * ab).to(dtype), ref_grad)
    return 3 * max(once, twice) + 1e-6


def _after(ck, w, t, dtype, reduction):
    """What the op's backward multiplies the stored gradient by (``_grad_bound``)."""
    if reduction == "mean" and ck.defers_scale(dtype):
        return w / (t != -100).sum().clamp(min=1).double()
    return w


def _check(loss, grad, x, t, c=1.0):
    ref_loss, ref_grad = ce_rows_reference(x, t, -100)
    ref_grad = ref_grad * c
    assert ((loss.double() - ref_loss).abs() / ref_loss.abs().clamp(min=1.0)).max().item() <= 2e-5
    assert not torch.isnan(grad).any()
    assert _err(grad, ref_grad) <= 3 * _err(ref_grad.to(x.dtype), ref_grad) + 1e-6
    assert (grad[t == -100] == 0).all()


def _inputs(rows, v, dtype, seed=0, spread=3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, v, device="cuda", generator=g) * spread).to(dtype)
    t = torch.randint(0, v, (rows,), device="cuda", generator=g)
    t[::5] = -100
    return x, t


HYBRID_V = [16392, 32768, 40000, 50304, 65536]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [16, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", HYBRID_V)
def test_forced_hybrid_rows_match_float64(ck, v, dtype, warps):
    """Loss rows and gradient (buffer poisoned with NaN: an element the kernel misses stays NaN) against
    float64, scale 1 / n_valid; per-row grad_output (FROM_S); loss only; in place over the logits
    (bit for bit the gradient written apart); deterministic."""
    p = ck.Plan("hybrid", ck._next_pow2(v), 1, warps)
    x, t = _inputs(64, v, dtype, seed=v)
    assert ck.hybrid_unusable(x, x, warps) is None
    count = (t != -100).sum().float().reshape(1)
    rows, grad = torch.empty(64, device="cuda"), torch.full_like(x, float("nan"))
    ck.launch_ce(x, t, rows, grad, -100, count=count, p=p)
    _check(rows, grad, x, t, 1.0 / count.item())
    go = torch.rand(64, device="cuda") + 0.5
    g2 = torch.full_like(x, float("nan"))
    ck.launch_ce(x, t, None, g2, -100, scale=go, p=p)
    _check(rows, g2, x, t, go.double()[:, None])
    only = torch.empty(64, device="cuda")
    ck.launch_ce(x, t, only, None, -100, p=p)
    assert torch.equal(only, rows)
    y, rows2 = x.clone(), torch.empty(64, device="cuda")
    ck.launch_ce(y, t, rows2, y, -100, count=count, p=p)
    assert torch.equal(y, grad) and torch.equal(rows2, rows)
    ck.launch_ce(x, t, rows2, g2, -100, count=count, p=p)
    assert torch.equal(g2, grad) and torch.equal(rows2, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", [16392, 50304, 65536])
def test_the_op_on_the_hybrid_path(ck, monkeypatch, v, dtype, reduction):
    """kernels.cross_entropy with LONG_PATH = "hybrid": the loss and its gradient (grad_output not 1)
    against float64, with some and with all targets ignored."""
    monkeypatch.setattr(ck, "LONG_PATH", "hybrid")
    for frac in ("some", "all"):
        x, t = _inputs(48, v, dtype, seed=v + 1)
        if frac == "all":
            t[:] = -100
        xr = x.clone().requires_grad_(True)
        loss = kernels.cross_entropy(xr, t, method="triton", reduction=reduction)
        x64 = x.double().requires_grad_(True)
        ref = kernels.reference_cross_entropy(x64, t, reduction=reduction)
        w = torch.rand(ref.shape, device="cuda", dtype=torch.float64) + 0.5
        (loss * w.float()).sum().backward()
        (ref * w).sum().backward()
        assert torch.isfinite(loss).all()
        assert ((loss.double() - ref.detach()).abs() / ref.detach().abs().clamp(min=1.0)).max().item() <= 2e-5
        if frac == "all":
            assert (xr.grad == 0).all()
        else:
            assert _err(xr.grad, x64.grad) <= _grad_bound(x64.grad, _after(ck, w, t, dtype, reduction), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", [16392, 50304, 65536])
def test_hybrid_extremes_and_out_of_range_targets(ck, v, dtype):
    """Large logits (1e4, target a little above), a row of -inf but its target (loss 0, gradient 0),
    -inf on half a row, a target at the last column and at column 0, and targets outside [0, V)
    (loss NaN, other rows untouched; launch_ce directly: the op's device assert is _targets_kernel's)."""
    p = ck.Plan("hybrid", ck._next_pow2(v), 1, 16)
    x, t = _inputs(16, v, torch.float32, seed=v + 2, spread=1.0)
    t[:] = torch.arange(16, device="cuda") * 997 % v
    t[6], t[7] = v - 1, 0
    x[0] += 1e4
    x[0, t[0]] += 3.0
    x[1] = float("-inf")
    x[1, t[1]] = 2.0
    x[2, : v // 2] = float("-inf")
    t[2] = v - 3
    x = x.to(dtype)
    rows, grad = torch.empty(16, device="cuda"), torch.full_like(x, float("nan"))
    ck.launch_ce(x, t, rows, grad, -100, p=p)
    _check(rows, grad, x, t)
    assert rows[1].item() == 0.0 and (grad[1] == 0).all() and (grad[2, : v // 2] == 0).all()
    for bad in (v, -5):
        t2 = t.clone()
        t2[3] = bad
        rows2, g2 = torch.empty(16, device="cuda"), torch.empty_like(x)
        ck.launch_ce(x, t2, rows2, g2, -100, p=p)
        ok = torch.arange(16, device="cuda") != 3
        assert torch.isnan(rows2[3]) and torch.equal(rows2[ok], rows[ok]) and torch.equal(g2[ok], grad[ok])


@pytest.mark.gpu
def test_hybrid_strided_rows_and_the_fallback_for_unaligned_ones(ck, monkeypatch):
    """A 16-byte aligned column slice takes the hybrid path; a slice one element off, or rows of an
    odd length, fall back (LONG_PATH = "hybrid") and still match float64."""
    monkeypatch.setattr(ck, "LONG_PATH", "hybrid")
    base, t = _inputs(32, 50304 + 64, torch.bfloat16, seed=3)
    t = t.clamp(max=50000)
    for x, usable in ((base[:, 16:16 + 50304], True), (base[:, 1:1 + 50304], False), (base[:, :50303], False)):
        assert (ck.hybrid_unusable(x, None) is None) == usable
        rows, count, grad = ck.forward(x, t, -100, "sum", True)
        _check(rows, grad, x, t)
