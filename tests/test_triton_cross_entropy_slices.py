"""The Triton cross-entropy's slices path (``cross_entropy_slices._ce_slices_kernel``, a Gluon kernel, GPU
only: 16-bit rows of more than 65536 columns, cut into slices that trade (max, sum) per row): it
compiles for sm_90 (no GPU needed) with its buffer at the start of shared memory, the exchange's
release and acquire, no spill at 8 warps; the slices' arithmetic and when the path may run; the plan
and the sweep's candidates; on a GPU, forced against float64, through the op, the counters it leaves
zeroed, CUDA graphs.

On a CPU the launches run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py), where the
slices path is never taken. HARNESS_COMPILE_PYTHON: another Python to compile with (e.g. a venv with
another Triton)."""

from __future__ import annotations

import re

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.runtime import availability
from tests.compiled_report import check_hybrid_layout, compile_cases
from tests.test_cross_entropy import DEVICE
from tests.test_triton_cross_entropy_hybrid import DTYPES, _check, _err, _FakeRows, _after, _grad_bound, _inputs

pytestmark = [pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture
def cs():
    from kernels.methods.triton.cross_entropy import slices as cross_entropy_slices

    return cross_entropy_slices


_COMPILE = r"""
import json, sys
import triton
from tests.compiled_report import compile_gluon_sm90, report
from kernels.methods.triton.cross_entropy import slices as cs
from kernels.methods.triton.softmax import plan as tp
from kernels.methods.triton.cross_entropy.gluon import hybrid_maxnreg

for case in sys.argv[1:]:
    dtype, v, grad, warps, n_slices = case.split(":")
    v, grad, warps, n_slices = int(v), grad == "1", int(warps), int(n_slices)
    P = f"*{dtype}"
    sig = {"X": P, "T": "*i64", "LOSS": "*fp32", "G": P, "S": "*fp32", "C": "*fp32", "XW": "*i32", "GW": "*i32",
           "CNT": "*i32", "STAT": "*fp32", "n_vec": "i32", "slice_vec": "i32", "n_slices": "i32", "stride_v": "i32",
           "stride_gv": "i32", "stride_s": "i32", "ignore_index": "i32", "zero": "i32"}
    sl, last, nr, ns, even = cs.slices_shape(v, n_slices, warps)
    const = {"NR": nr, "NS": ns, "EVEN": even, "BF16": dtype == "bf16", "SP2": tp._next_pow2(n_slices),
             "FROM_S": grad, "DIVIDE": True, "WRITE_LOSS": True, "WRITE_GRAD": grad}
    k = compile_gluon_sm90(cs._ce_slices_kernel, sig, const, (0, 3, 6, 7, 8, 9), warps, hybrid_maxnreg(warps))
    print(json.dumps({"case": case, "ns": ns, "triton": triton.__version__, **report(k)}))
"""

_SMEM_OFFSET = r"ld\.shared\.b32\s+%r\d+, \[global_smem(?:\+(\d+))?\]"


@pytest.mark.slow  # a cold sm_90 compile of the slices kernel: ~35 s on two cores (CI starts cold)
def test_slices_kernel_compiles_for_sm90(cs):
    """bf16 and fp16, with and without the gradient, even and uneven slices (65544: a shorter last
    slice), 2 to 16 slices, 8 and 16 warps: compiled for Hopper (sm_90) in a subprocess without
    TRITON_INTERPRET. As the hybrid kernel: the shared part at offset 0 (slot-multiple offsets below
    its end with the gradient, scratch past it), within the H200's 227 KB per block, nothing in local
    memory, registers within maxnreg; no spill at 8 warps (the plan's); at 16 warps (64 registers, a
    sweep candidate) a few words of the registers' part do spill (STACK 80 bytes with Triton 3.9, 8-24 with 3.6).
    The ticket's broadcast scratch lies past the shared part (its copies are in flight then); the
    partials are stored, then a block barrier, then the arrival (acq_rel), then the wait (acquire)."""
    if availability.GLUON_ERROR:
        pytest.skip(availability.GLUON_ERROR)
    cases = ["bf16:128256:1:8:2", "fp16:262144:1:8:4", "bf16:100000:0:8:2", "fp16:65544:1:8:2",
             "bf16:300000:1:8:5", "fp16:1048576:1:8:16", "bf16:128256:1:16:2", "bf16:262144:0:16:4"]
    for r in compile_cases(_COMPILE, cases):
        dtype, v, grad, warps, n_slices = r["case"].split(":")
        check_hybrid_layout(r, int(warps), grad == "1", cs.hybrid_maxnreg(int(warps)))
        buffer, ptx = r["ns"] * 16 * 32 * int(warps), r["ptx"]
        assert r["shared"] <= 227 * 1024, r["case"]
        ticket = ptx.index("atom.global.gpu.relaxed.add")  # the first atomic: the ticket
        first_ld = re.search(_SMEM_OFFSET, ptx[ticket:])
        assert first_ld and int(first_ld.group(1) or 0) >= buffer, (r["case"], first_ld and first_ld.group(0))
        arrive = ptx.index("atom.global.gpu.acq_rel.add")
        partials = ptx.rindex("st.global.b32", 0, arrive)
        assert "bar.sync" in ptx[partials:arrive], r["case"]
        assert re.search(r"(ld\.global\.gpu\.acquire|atom\.global\.gpu\.acquire)", ptx[arrive:]), r["case"]


def test_slices_shape_and_reasons(cs):
    """Balanced slices of a multiple of 8 columns, the last at most 8 S shorter; the refusals: rows
    the hybrid path takes, columns not a multiple of 8, slice counts outside 2..MAX_SLICES, slices
    longer than 65536 or no longer than the registers' part, a last slice too short to hold all but
    the last of its shared vectors."""
    for v in (65544, 100000, 128256, 262144, 300000, 1 << 20, 65536 * cs.MAX_SLICES):
        s = cs.default_slices(v)
        for w in (8, 16):
            assert cs.slices_reason(v, s, w) is None, (v, w)
            sl, last, nr, ns, even = cs.slices_shape(v, s, w)
            assert sl % 8 == 0 and sl <= 65536 and (s - 1) * sl + last == v and sl - 8 * s < last <= sl
            assert last >= (nr + ns - 1) * 32 * w * 8 and ns >= 1
            assert even == (sl == (nr + ns) * 32 * w * 8 and last == sl)
    assert cs.default_slices(128256) == 2 and cs.slices_shape(128256, 2, 8)[:2] == (64128, 64128)
    assert cs.default_slices(262144) == 4 and cs.slices_shape(262144, 4, 8)[:2] == (65536, 65536)
    assert cs.slices_shape(65544, 2, 8)[:2] == (32776, 32768)  # (a shorter last slice)
    assert "more than 65536" in cs.slices_reason(65536, 2, 8)
    assert "multiple of 8" in cs.slices_reason(128250, 2, 8)
    assert "2 to 64 slices" in cs.slices_reason(65536 * 64 + 8, 65, 8)
    assert "2 to 64 slices" in cs.slices_reason(128256, 1, 8)
    assert "longer than 65536" in cs.slices_reason(200000, 2, 8)
    assert "registers hold" in cs.slices_reason(65544, 9, 8)  # slices of 7288 columns, 8192 in registers
    assert "last slice of 16368" in cs.slices_reason(65544, 4, 8)  # 16392 x 3 + 16368: 2 vectors short


def test_slices_unusable_reasons(cs, monkeypatch):
    """The interpreter, the slices' arithmetic, the dtype, alignment (row stride, address; logits and
    gradient), shared memory per block, the program count; None where it can run."""
    x = torch.zeros(2, 128256, dtype=torch.bfloat16)
    if availability.GLUON_ERROR:
        assert cs.slices_unusable(x, x, 8) is not None
        return
    monkeypatch.setattr(cs, "interpreter_enabled", lambda: True)
    assert "interpreter" in cs.slices_unusable(x, x, 8)
    monkeypatch.setattr(cs, "interpreter_enabled", lambda: False)
    assert "GPU only" in cs.slices_unusable(x, None, 8)
    from types import SimpleNamespace

    props = SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=227 * 1024, multi_processor_count=132)
    monkeypatch.setattr(tp, "device_props", lambda device: props)
    for v in (65544, 128256, 262144, 300000, 1 << 20):
        for w in (8, 16):
            assert cs.slices_unusable(_FakeRows(v), _FakeRows(v), w) is None, (v, w)
    assert cs.slices_unusable(_FakeRows(128256), None, 8, n_slices=3) is None
    assert "more than 65536" in cs.slices_unusable(_FakeRows(50304), None, 8)
    assert "multiple of 8" in cs.slices_unusable(_FakeRows(128250), None, 8)
    assert "last slice" in cs.slices_unusable(_FakeRows(65544), None, 8, n_slices=4)
    assert "16-bit" in cs.slices_unusable(_FakeRows(128256, dtype=torch.float32), None, 8)
    assert "dtype" in cs.slices_unusable(_FakeRows(128256), _FakeRows(128256, dtype=torch.float16), 8)
    for bad in (_FakeRows(128256, stride0=128260), _FakeRows(128256, ptr=2), _FakeRows(128256, col_stride=2)):
        assert "16-byte aligned" in cs.slices_unusable(bad, None, 8)
        assert "16-byte aligned" in cs.slices_unusable(_FakeRows(128256), bad, 8)
    assert "slices path" in cs.slices_unusable(bad, None, 8)
    assert cs.slices_unusable(_FakeRows(128256, stride0=128256 + 64), None, 8) is None  # an aligned column slice
    many = _FakeRows(262144)
    many.shape = (2**29, 262144)
    assert "too many" in cs.slices_unusable(many, None, 8)
    props.major = 7
    assert "cp.async" in cs.slices_unusable(_FakeRows(128256), None, 8)
    props.major, props.shared_memory_per_block_optin = 9, 100 * 1024  # (112 KB a slice of 64128 at 8 warps)
    assert "shared memory" in cs.slices_unusable(_FakeRows(128256), None, 8)
    assert cs.slices_unusable(_FakeRows(128256), None, 16) is None  # (96 KB at 16 warps)


def test_plan_takes_the_slices_path_exactly_in_its_range(ck, cs, monkeypatch):
    """16-bit rows of more than 65536 columns, a multiple of 8, at most MAX_SLICES x 65536: the slices
    path (fewest slices of at most 65536 columns, 8 warps); the stream path beyond, for odd lengths,
    32-bit rows, hybrid=False and another LONG_PATH; the hybrid path up to 65536."""
    assert ck.LONG_PATH == "hybrid"
    for v in (65544, 100000, 128256, 262144, 300000, 1 << 20, 65536 * cs.MAX_SLICES):
        s = cs.default_slices(v)
        assert ck.plan(v) == ck.Plan("slices", cs.slices_shape(v, s, 8)[0], 1, ck.SLICES_WARPS, s), v
        assert ck.plan(v, elem_bytes=4).path == ck.plan(v, hybrid=False).path == "stream", v
    assert ck.plan(128256).block_n == 64128 and ck.plan(262144).slices == 4
    for v in (65537, 65540, 128250, 65536 * cs.MAX_SLICES + 8, 2**24):
        assert ck.plan(v).path == "stream", v
    assert ck.plan(65536).path == "hybrid"
    monkeypatch.setattr(ck, "LONG_PATH", "stream")
    assert ck.plan(128256).path == "stream"


def test_launch_falls_back_where_the_slices_path_cannot_run(ck):
    """In the interpreter (or wherever slices_unusable says no) rows past 65536 columns take the stream
    path and match float64; a slices plan asked for by name is an error, not another path."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's fallback")
    assert ck.plan(65544).path == "slices"
    x = torch.randn(2, 65544, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    t = torch.tensor([65543, -100])
    rows, count, grad = ck.forward(x, t, -100, "sum", True)
    x64 = x.double().requires_grad_(True)
    ref = kernels.reference_cross_entropy(x64, t, reduction="none")
    ref.sum().backward()
    assert kernels.relative_error(rows, ref) <= 1e-5 and kernels.relative_error(grad, x64.grad) <= 1e-2
    with pytest.raises(ValueError, match="slices path"):
        ck.forward(x, t, -100, "sum", True, p=ck.plan(65544))


def test_sweep_candidates_include_the_slices_path_only_where_usable(ck):
    from harness.bench.tuning.triton_ce_sweep import candidates, current_plan

    c = candidates(128256)  # (nothing usable: the stream plan launch_ce falls back to comes first)
    assert c[0] == ck.plan(128256, hybrid=False) and all(p.path != "slices" for p in c)
    c = candidates(128256, lambda p: True)
    slices = [(p.slices, p.num_warps) for p in c if p.path == "slices"]
    assert c[0] == ck.plan(128256) == current_plan(128256, lambda p: True) and len(set(c)) == len(c)
    assert slices == [(2, 8), (2, 16), (3, 8), (3, 16), (4, 8), (4, 16)]
    assert [(p.slices, p.num_warps) for p in candidates(262144, lambda p: True) if p.path == "slices"] == [
        (4, 8), (4, 16), (5, 8), (5, 16), (8, 8), (8, 16)]
    # 65544 in 4 slices leaves a last slice too short: not a candidate
    assert {p.slices for p in candidates(65544, lambda p: True) if p.path == "slices"} == {2, 3}
    assert all(p.num_warps == 8 for p in candidates(128256, lambda p: p.num_warps == 8) if p.path == "slices")
    assert all(p.path != "slices" for v in (50304, 65536, 65537, 2**24) for p in candidates(v, lambda p: True))


# ------------------------------------------------------------------------------------------------
# GPU (skipped without one)
# ------------------------------------------------------------------------------------------------
SLICES_V = [65544, 100000, 128256, 262144, 300000]


def _plans(ck, cs, v):
    """The default plan, 16 warps, one more slice (where the row can be cut so)."""
    s = cs.default_slices(v)
    return [p for p in (ck.slices_plan(v, s, 8), ck.slices_plan(v, s, 16), ck.slices_plan(v, s + 1, 8)) if p]


def _zeroed_counters(cs):
    return all(int(b.abs().sum()) == 0 for b in cs._COUNTERS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", SLICES_V)
def test_forced_slices_rows_match_float64(ck, cs, v, dtype):
    """Loss rows and gradient (buffer poisoned with NaN) against float64, scale 1 / n_valid; per-row
    grad_output; loss only; in place over the logits (bit for bit the gradient written apart);
    deterministic; the counters left zeroed; for the default plan, 16 warps and one more slice."""
    rows_n = 48
    x, t = _inputs(rows_n, v, dtype, seed=v)
    s = cs.default_slices(v)
    t[1], t[2], t[3] = cs.slices_shape(v, s, 8)[0] - 1, cs.slices_shape(v, s, 8)[0], v - 1  # slice edges
    count = (t != -100).sum().float().reshape(1)
    for p in _plans(ck, cs, v):
        assert ck.unusable(x, x, p) is None, p
        rows, grad = torch.empty(rows_n, device="cuda"), torch.full_like(x, float("nan"))
        ck.launch_ce(x, t, rows, grad, -100, count=count, p=p)
        _check(rows, grad, x, t, 1.0 / count.item())
        go = torch.rand(rows_n, device="cuda") + 0.5
        g2 = torch.full_like(x, float("nan"))
        ck.launch_ce(x, t, None, g2, -100, scale=go, p=p)
        _check(rows, g2, x, t, go.double()[:, None])
        only = torch.empty(rows_n, device="cuda")
        ck.launch_ce(x, t, only, None, -100, p=p)
        assert torch.equal(only, rows), p
        y, rows2 = x.clone(), torch.empty(rows_n, device="cuda")
        ck.launch_ce(y, t, rows2, y, -100, count=count, p=p)
        assert torch.equal(y, grad) and torch.equal(rows2, rows), p
        ck.launch_ce(x, t, rows2, g2, -100, count=count, p=p)
        assert torch.equal(g2, grad) and torch.equal(rows2, rows), p
        torch.cuda.synchronize()
        assert _zeroed_counters(cs), p


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", [65544, 128256, 262144])
def test_slices_extremes_and_out_of_range_targets(ck, cs, v, dtype):
    """Large logits (1e4, target a little above), a row of -inf but its target, -inf on half a row,
    slices of only -inf beside very negative logits (-300: exp2 of +433 would overflow without the
    clamp), targets at column 0, at the last column and at a slice's first column, targets outside
    [0, V) (loss NaN, other rows untouched), all targets ignored (loss 0, gradient 0)."""
    p = ck.plan(v)
    sl = p.block_n
    x, t = _inputs(16, v, torch.float32, seed=v + 2, spread=1.0)
    t[:] = torch.arange(16, device="cuda") * 997 % v
    t[6], t[7], t[8] = v - 1, 0, sl
    x[0] += 1e4
    x[0, t[0]] += 3.0
    x[1] = float("-inf")
    x[1, t[1]] = 2.0
    x[2, : v // 2] = float("-inf")
    t[2] = v - 3
    x[4] = -300.0
    x[4, sl:] = float("-inf")  # slices 1.. hold nothing finite
    t[4] = 5
    x[5] = float("-inf")
    x[5, sl + 3] = -300.0  # only slice 1 holds a finite logit
    t[5] = sl + 3
    x = x.to(dtype)
    rows, grad = torch.empty(16, device="cuda"), torch.full_like(x, float("nan"))
    ck.launch_ce(x, t, rows, grad, -100, p=p)
    _check(rows, grad, x, t)
    assert rows[1].item() == 0.0 and (grad[1] == 0).all() and (grad[2, : v // 2] == 0).all()
    assert (grad[4, sl:] == 0).all() and rows[5].item() == 0.0 and (grad[5] == 0).all()
    for bad in (v, -5):
        t2 = t.clone()
        t2[3] = bad
        rows2, g2 = torch.empty(16, device="cuda"), torch.empty_like(x)
        ck.launch_ce(x, t2, rows2, g2, -100, p=p)
        ok = torch.arange(16, device="cuda") != 3
        assert torch.isnan(rows2[3]) and torch.equal(rows2[ok], rows[ok]) and torch.equal(g2[ok], grad[ok])
    t3 = torch.full_like(t, -100)
    rows3, g3 = torch.full((16,), float("nan"), device="cuda"), torch.full_like(x, float("nan"))
    ck.launch_ce(x, t3, rows3, g3, -100, p=p)
    assert (rows3 == 0).all() and (g3 == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", [100000, 128256, 262144])
def test_the_op_on_the_slices_path(ck, v, dtype, reduction):
    """kernels.cross_entropy (the default plan: slices): the loss and its gradient (grad_output not 1)
    against float64, with some and with all targets ignored."""
    assert ck.plan(v).path == "slices"
    for frac in ("some", "all"):
        x, t = _inputs(32, v, dtype, seed=v + 1)
        if frac == "all":
            t[:] = -100
        assert ck.unusable(x, None, ck.plan(v)) is None
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
@pytest.mark.parametrize("v", [128256, 262144])
def test_slices_many_programs_match_the_stream_path(ck, cs, v):
    """Far more (row, slice) programs than the GPU holds at once (tickets, waits, counters reset row
    after row), launched twice with different row counts: the same loss rows and gradient as the
    stream path (within bf16 rounding), the counters left zeroed."""
    for n in (4096, 1000):
        x, t = _inputs(n, v, torch.bfloat16, seed=n)
        rows, grad = torch.empty(n, device="cuda"), torch.empty_like(x)
        ck.launch_ce(x, t, rows, grad, -100, p=ck.plan(v))
        rows_s, grad_s = torch.empty(n, device="cuda"), torch.empty_like(x)
        ck.launch_ce(x, t, rows_s, grad_s, -100, p=ck.plan(v, hybrid=False))
        assert torch.allclose(rows, rows_s, rtol=1e-5, atol=1e-5)
        assert (grad.float() - grad_s.float()).abs().max().item() <= 2**-7 * grad_s.float().abs().max().item()
        torch.cuda.synchronize()
        assert _zeroed_counters(cs)
        del x, grad, grad_s
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_slices_in_a_cuda_graph_and_on_a_side_stream(ck, cs):
    """Captured in a CUDA graph (fresh zeroed counters, a memset in the graph) and replayed, and
    launched on a side stream (its own cached counters): the eager result each time."""
    v = 128256
    x, t = _inputs(64, v, torch.bfloat16, seed=7)
    rows, grad = torch.empty(64, device="cuda"), torch.empty_like(x)
    ck.launch_ce(x, t, rows, grad, -100)
    r2, g2 = torch.empty_like(rows), torch.empty_like(grad)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ck.launch_ce(x, t, r2, g2, -100)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            ck.launch_ce(x, t, r2, g2, -100)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(r2, rows) and torch.equal(g2, grad)
    for _ in range(3):
        r2.zero_(), g2.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(r2, rows) and torch.equal(g2, grad)
    assert _zeroed_counters(cs)


@pytest.mark.gpu
def test_slices_strided_rows_and_the_fallback_for_unaligned_ones(ck):
    """A 16-byte aligned column slice takes the slices path; a slice one element off, or rows of an
    odd length, fall back to the stream path and still match float64."""
    base, t = _inputs(16, 128256 + 64, torch.bfloat16, seed=3)
    t = t.clamp(max=128000)
    for x, usable in ((base[:, 16:16 + 128256], True), (base[:, 1:1 + 128256], False), (base[:, :128255], False)):
        assert (ck.unusable(x, None, ck.plan(128256)) is None) == usable
        rows, count, grad = ck.forward(x, t, -100, "sum", True)
        _check(rows, grad, x, t)
