"""The Triton kernels' own paths: long rows (forced small), launch plans, op registration, errors.

On a CPU these run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.helpers import BWD_TOL, FWD_TOL, check_method, random_scores

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ts():
    from kernels.methods import triton_softmax

    return triton_softmax


@pytest.fixture(params=["long", "split"])
def forced_path(request, ts, monkeypatch):
    """long: rows longer than 16 take the long (streaming) path, in chunks of 8. split: rows longer
    than 8 take the split path, in chunks of 8 (up to 8 chunks; longer: the long path)."""
    if request.param == "long":
        monkeypatch.setattr(ts, "MAX_TILE_N", 16)
        monkeypatch.setattr(ts, "LONG_BLOCK_N", 8)
    else:
        monkeypatch.setattr(ts, "SPLIT_ABOVE_N", 8)
        monkeypatch.setattr(ts, "SPLIT_BLOCK_N", 8)
        monkeypatch.setattr(ts, "MAX_SPLITS", 8)
        monkeypatch.setattr(ts, "_SPLIT_FROM", {False: 0, True: 0})
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "shape,causal",
    [((3, 37), False), ((2, 64), False), ((2, 20, 20), True), ((2, 9, 30), True), ((2, 30, 9), True),
     ((1, 17), False), ((1, 9), False)],
)
def test_long_and_split_paths_match_reference(forced_path, ts, shape, causal, dtype, seeded):
    """The streaming path, and a row over several programs (in the interpreter: partials first, then
    outputs, two launches)."""
    assert getattr(ts.plan(shape[-1], 4), forced_path) or (forced_path == "long" and shape[-1] <= 16)
    fwd, bwd = check_method("triton", random_scores(shape, dtype, DEVICE, gen=seeded), 0.5, causal)
    assert fwd <= FWD_TOL[dtype] and bwd <= BWD_TOL[dtype], (fwd, bwd)


def test_long_and_split_paths_non_contiguous(forced_path, seeded):
    x = random_scores((2, 40, 24), torch.float32, DEVICE, gen=seeded).transpose(-1, -2)  # (2, 24, 40)
    fwd, bwd = check_method("triton", x, 0.5, True)
    assert fwd <= 1e-5 and bwd <= 1e-4


@pytest.mark.parametrize("forced_path", ["split"], indirect=True)
def test_split_path_extremes(forced_path, seeded):
    big = torch.full((2, 30), -float("inf"), device=DEVICE)
    big[0, 3], big[0, 17] = 1e30, 1e30  # huge scores in two different chunks; row 1 entirely -inf
    y = kernels.softmax(big, method="triton")
    assert torch.equal(y[1].cpu(), torch.zeros(30))
    assert y[0, 3].item() == 0.5 and y[0, 17].item() == 0.5 and y[0].sum().item() == 1.0


@pytest.mark.parametrize("path", ["tile", "fill", "persistent", "long", "split", "hybrid"])
@pytest.mark.parametrize("scale", [1.0, -0.5])
def test_every_forward_path_takes_huge_scores(ts, path, scale):
    """Scores of 1e30 (two equal maxima in different chunks) and of 1e4: every forward kernel takes
    its exponents relative to the row's max score exactly (on a GPU, exp2(fma(x, c, -round(max * c)))
    would shift them all by the max's rounding error, which overflows exp2 at this magnitude). The
    hybrid path (GPU only, longer rows) falls back to the tile path here; the GPU tests below take it."""
    plan = {"tile": ts.Plan(False, 64, 2, 1), "fill": ts.Plan(False, 64, 2, 1, fill=True), "persistent": ts.Plan(False, 64, 1, 1, stages=2),
            "long": ts.Plan(True, 16, 1, 1), "split": ts.Plan(False, 16, 1, 1, split=True),
            "hybrid": ts.Plan(False, 64, 1, 1, hybrid=True)}[path]
    x = torch.full((3, 64), -float("inf") if scale > 0 else float("inf"), device=DEVICE)  # x * scale = -inf
    x[0, 3], x[0, 40] = 1e30 * scale, 1e30 * scale  # the row's maximum of x * scale, twice
    x[1] = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(DEVICE) * 1e4
    x[2, :5] = 1.0
    y = ts.launch_fwd(x, scale, False, plan).cpu()
    assert y[0, 3].item() == 0.5 and y[0, 40].item() == 0.5 and y[0].sum().item() == 1.0
    assert kernels.relative_error(y[1:], kernels.reference_softmax(x[1:].cpu(), scale=scale)) <= 1e-5
    assert torch.equal(y[2, 5:], torch.zeros(59))


@pytest.mark.parametrize("shape,causal", [((9, 37), False), ((2, 20, 20), True), ((2, 9, 30), True), ((2, 30, 9), True)])
def test_persistent_path_matches_reference(ts, shape, causal, seeded):
    """Persistent programs looping over rows (pipelined on a GPU), forward and backward."""
    x = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    p = ts.Plan(False, 64, 1, 1, stages=2)
    y = ts.launch_fwd(x, 0.5, causal, p)
    assert kernels.relative_error(y, kernels.reference_softmax(x, scale=0.5, causal=causal)) <= FWD_TOL[torch.bfloat16]
    dy = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    dx = ts.launch_bwd(y, dy, 0.5, causal, p)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.5)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[torch.bfloat16]


@pytest.mark.parametrize("variant", ["whole-vector loads", "exact loads", "fill", "fill, 2 warps"])
@pytest.mark.parametrize("shape", [(2, 20, 20), (2, 9, 30), (2, 30, 9), (3, 7, 13)])
def test_causal_tile_variants_match_reference(ts, shape, variant, seeded):
    """Every causal forward variant the sweep may pick (the tile kernel's exact or whole-vector prefix
    loads; the fill kernel, rows per program not dividing the rows, a row over two warps) gives the
    reference result, fully masked rows included."""
    x = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    p = {"whole-vector loads": ts.Plan(False, 32, 2, 1), "exact loads": ts.Plan(False, 32, 2, 1, round_mask=False),
         "fill": ts.Plan(False, 32, 4, 1, fill=True), "fill, 2 warps": ts.Plan(False, 32, 1, 2, fill=True)}[variant]
    y = ts.launch_fwd(x, 0.5, True, p)
    ref = kernels.reference_softmax(x, scale=0.5, causal=True)
    assert kernels.relative_error(y, ref) <= FWD_TOL[torch.bfloat16]
    masked = torch.ones(shape[-2], shape[-1], dtype=torch.bool).triu(shape[-1] - shape[-2] + 1)
    assert (y.cpu()[..., masked] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fill_kernel_scales_and_special_values(ts, dtype):
    """The fill kernel (causal forward rows) reads masked columns as -inf (positive scale) or +inf
    (negative): right for any finite nonzero scale; scale 0 takes the tile kernel (masked element by
    element). Special values keep their meaning: -inf scores get 0, a row whose kept scores are all
    -inf gives zeros, a NaN or a +inf score makes its row NaN, a NaN past the prefix changes nothing."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 12, 21, generator=g) * 3).to(dtype)  # Tk - Tq = 9: row i keeps i + 10 keys
    x[0, 5, :3] = float("-inf")
    x[0, 2, :12] = float("-inf")  # every kept key
    x[1, 4, 1] = float("nan")
    x[1, 7, 0] = float("inf")
    x[1, 3, 20] = float("nan")  # masked (row 3 keeps 13 keys; 21 columns: prefixes end mid-vector)
    p = ts.plan(21, x.element_size(), causal=True)
    assert p.fill
    masked = torch.ones(12, 21, dtype=torch.bool).triu(21 - 12 + 1)
    for scale in (0.3, -0.7, 1e-30, 0.0):
        y = ts.launch_fwd(x.to(DEVICE), scale, True, p).cpu()
        ref = kernels.reference_softmax(x, scale=scale, causal=True).to(dtype)
        assert torch.equal(y.isnan(), ref.isnan()), scale
        ok = ~ref.isnan()
        assert kernels.relative_error(y[ok], ref[ok]) <= FWD_TOL[dtype], scale
        finite_rows = ~ref.isnan().any(-1, keepdim=True)
        assert (y[finite_rows & masked] == 0).all(), scale
    y = ts.launch_fwd(x.to(DEVICE), 0.3, True, p).cpu()
    assert torch.equal(y[0, 2], torch.zeros(21, dtype=dtype))  # kept keys all -inf: zeros
    assert y[1, 4].isnan().all() and y[1, 7].isnan().all() and not y[1, 3].isnan().any()
    assert y[0, 5, :3].eq(0).all() and y[0, 5].sum().item() == pytest.approx(1.0, rel=1e-2)
    assert ts.fill_scale_ok(1e-30 * ts.LOG2E) and not ts.fill_scale_ok(0.0) and not ts.fill_scale_ok(float("inf"))
    with pytest.raises(ValueError, match="forward path"):
        ts.launch_bwd(y, y, 0.3, True, p)


def test_plan_packs_short_rows_splits_long_ones_and_streams_longer_ones(ts):
    short = ts.plan(128, 2)
    assert not short.long and short.rows > 1 and short.block_n == 128
    odd = ts.plan(1000, 2)
    assert not odd.long and odd.block_n == 1024
    long = ts.plan(2**21, 2)
    assert long.long and long.block_n == ts.LONG_BLOCK_N
    tiny = ts.plan(7, 4)
    assert not tiny.long and tiny.rows * tiny.block_n >= 1024
    assert not ts.plan(ts.SPLIT_ABOVE_N, 2).split and not ts.plan(ts.SPLIT_ABOVE_N, 2, backward=True).split
    assert ts.plan(262144, 2).split and ts.plan(262144, 2).block_n == ts.SPLIT_BLOCK_N
    assert ts.plan(65536, 2, backward=True, gluon=False).split
    assert ts.plan(32768, 2, gluon=False).stages and ts.plan(32768, 2, backward=True).stages  # persistent, 16-bit
    assert not ts.plan(32768, 4).stages and not ts.plan(1024, 2, causal=True).stages
    widest = ts.MAX_SPLITS * ts.SPLIT_BLOCK_N
    assert ts.plan(widest, 2).split and ts.plan(widest + 1, 2).long  # too many chunks: the long path


def test_plan_takes_the_gluon_paths_for_long_16_bit_rows_and_falls_back_where_they_cannot(ts):
    """16-bit rows, not causal: the hybrid path forward for 16385-65536 columns, the ring path backward
    for 32769-65536; elsewhere (fp32, causal, gluon=False) neither; where they cannot run (here: the
    interpreter), launch_fwd and launch_bwd take the plan for gluon=False and still give the reference
    result; each path is one direction's only."""
    for n in (ts.HYBRID_MIN_N + 8, ts.MAX_TILE_N, ts.MAX_TILE_N + 8, 40000, ts.RING_MAX_N):
        p = ts.plan(n, 2)
        assert p.hybrid and not p.ring and p.num_warps == ts.HYBRID_WARPS
    for n in (ts.MAX_TILE_N + 8, 40000, ts.RING_MAX_N):
        p = ts.plan(n, 2, backward=True)
        assert p.ring and not p.hybrid and p.num_warps == ts.RING_WARPS
    assert ts.HYBRID_MIN_N == ts.HYBRID_REG_VECS * 8 * 32 * ts.HYBRID_WARPS  # (the registers' part, 16-bit)
    assert not ts.plan(ts.HYBRID_MIN_N, 2).hybrid and not ts.plan(ts.MAX_TILE_N, 2, backward=True).ring
    assert not ts.plan(ts.RING_MAX_N + 8, 2).hybrid and not ts.plan(ts.RING_MAX_N + 8, 2, backward=True).ring
    others = [ts.plan(65536, *args) for args in ((4,), (4, True), (2, False, True), (2, True, True))]
    assert not any(p.ring or p.hybrid for p in others)
    assert ts.plan(65536, 2, gluon=False).long and ts.plan(65536, 2, backward=True, gluon=False).split
    x = random_scores((3, 40), torch.bfloat16, DEVICE)
    hp, rp = ts.Plan(False, 64, 1, 1, hybrid=True), ts.Plan(False, 64, 1, 1, ring=True, slots=9)
    if not torch.cuda.is_available():
        assert "GPU" in ts.gluon_unusable(x, False, hp) and "GPU" in ts.gluon_unusable(x, False, rp, x)
    assert "causal" in ts.gluon_unusable(x, True, hp) and "causal" in ts.gluon_unusable(x, True, rp, x)
    y = ts.launch_fwd(x, 0.5, False, hp)
    assert kernels.relative_error(y, kernels.reference_softmax(x, scale=0.5)) <= FWD_TOL[torch.bfloat16]
    dy = random_scores((3, 40), torch.bfloat16, DEVICE)
    dx = ts.launch_bwd(y, dy, 0.5, False, rp)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.5)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="backward path"):
        ts.launch_fwd(x, 0.5, False, rp)
    with pytest.raises(ValueError, match="forward path"):
        ts.launch_bwd(y, dy, 0.5, False, hp)


def test_ring_launch_arithmetic_on_an_h200_sized_gpu(ts, monkeypatch):
    """The ring launches on a GPU of 132 SMs and 227 KB of shared memory per block (no GPU needed):
    the backward's grid is a program pair per row while rows are fewer than half the SMs (5 rows: 5
    pairs, not min(5, 132) // 2 = 2), one program per SM beyond (66 pairs), at least one; the ring
    keeps the plan's 13 slots of 16 KB, fewer where the plan asks for more than fit."""
    from types import SimpleNamespace

    gpu = torch.device("cuda", 0)
    monkeypatch.setitem(ts._DEVICE_PROPS, gpu,
                        SimpleNamespace(multi_processor_count=132, shared_memory_per_block_optin=227 * 1024))
    p = ts.plan(65536, 2, backward=True)
    assert [ts.ring_pairs(r, gpu, p) for r in (1, 5, 65, 66, 67, 131, 2048)] == [1, 5, 65, 66, 66, 66, 66]
    assert 2 * ts.ring_pairs(10**6, gpu, p) <= 132
    assert ts.ring_slots(gpu, p) == ts.RING_SLOTS == 13
    assert ts.ring_slots(gpu, ts.Plan(False, 65536, 1, 32, ring=True, slots=20)) == 14  # (227 - 1) KB // 16 KB


def test_hybrid_launch_arithmetic(ts):
    """The hybrid path's split of a row: 4 vectors per thread in registers (16384 columns at 16 warps),
    the rest in shared memory, partial only in its last vector; none left for rows the registers hold
    alone (gluon_unusable turns those away); the longest row's shared part lets two programs share a
    227 KB SM."""
    p = ts.plan(ts.RING_MAX_N, 2)
    assert ts._hybrid_shape(65536, p) == (4, 12, True) and ts._hybrid_shape(49152, p) == (4, 8, True)
    assert ts._hybrid_shape(40000, p) == (4, 6, False) and ts._hybrid_shape(16392, p) == (4, 1, False)
    assert ts._hybrid_shape(ts.HYBRID_MIN_N, p)[1] == 0
    nr, ns, _ = ts._hybrid_shape(ts.RING_MAX_N, p)
    assert 2 * (ns * 16 * 32 * p.num_warps + 1024) <= 227 * 1024


_GLUON_COMPILE = r"""
import json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from kernels.methods import triton_softmax as ts

kernel, dtype, even = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
div16 = lambda n: {(i,): [["tt.divisibility", 16]] for i in range(n)}  # the first n pointers: 16-byte aligned
if kernel == "fwd":  # the hybrid forward: 65536 columns (12 shared vectors per thread), or 49152 (8) and partial
    sig = {"X": f"*{dtype}", "Y": f"*{dtype}", "XW": "*i32", "YW": "*i32", "n_vec": "i32", "stride_v": "i32",
           "scale_log2e": "fp32", "zero": "i32", "NR": "constexpr", "NS": "constexpr", "EVEN": "constexpr", "BF16": "constexpr"}
    src = GluonASTSource(fn=ts._fwd_hybrid_kernel, signature=sig, attrs=div16(4),
                         constexprs={"NR": ts.HYBRID_REG_VECS, "NS": 12 if even else 8, "EVEN": even,
                                     "BF16": dtype == "bf16"})
    options = {"num_warps": ts.HYBRID_WARPS, "maxnreg": ts.HYBRID_MAX_REGS}
else:
    sig = {"Y": f"*{dtype}", "DY": f"*{dtype}", "DX": f"*{dtype}", "XCH": "*i64", "n_rows": "i32", "n_vec": "i32",
           "stride_v": "i32", "scale": "fp32", "VEC": "constexpr", "NCH": "constexpr", "SLOTS": "constexpr"}
    src = GluonASTSource(fn=ts._bwd_pair_ring_kernel, signature=sig, attrs=div16(3),
                         constexprs={"VEC": 8, "NCH": 4 if even else 3, "SLOTS": ts.RING_SLOTS})
    options = {"num_warps": ts.RING_WARPS}
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
usage = ""
cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
if cuobjdump.exists():
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
print(json.dumps({"offsets": [int(o) for o in re.findall(r"@global_smem, i32 (\d+)\)", k.asm["llir"])],
                  "shared": k.metadata.shared, "ptx": k.asm["ptx"], "usage": usage}))
"""


@pytest.mark.parametrize("kernel,dtype,even", [("fwd", "bf16", True), ("fwd", "fp16", False), ("bwd", "bf16", True),
                                               ("bwd", "fp16", False)])
def test_gluon_kernels_compile_for_sm90_with_their_buffer_at_the_start_of_shared_memory(ts, kernel, dtype, even):
    """The Gluon kernels (the hybrid forward; the ring backward over program pairs) compile for Hopper
    (sm_90; ptxas ships with Triton) at the launch table's settings, spill nothing, and their buffer
    (the hybrid's shared part, the ring) lies at offset 0 of the kernel's shared memory, where their
    inline cp.async addresses it: every constant offset into shared memory is one of its slots or
    (the reductions' scratch) lies past it. The ring fits the H200's shared memory; two hybrid programs fit one H200 SM (shared
    memory, and at most 64 registers for 512 threads). Compiled in a subprocess without
    TRITON_INTERPRET (the interpreter's stand-ins for Triton's library functions do not compile)."""
    import json
    import os
    import re
    import subprocess
    import sys

    if ts._GLUON_ERROR:
        pytest.skip(ts._GLUON_ERROR)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _GLUON_COMPILE, kernel, dtype, str(int(even))], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    k = json.loads(run.stdout.strip().splitlines()[-1])
    if kernel == "fwd":
        buffer = (12 if even else 8) * 16 * 32 * ts.HYBRID_WARPS
        assert buffer <= k["shared"] <= 227 * 1024 // 2
        assert "cp.async.wait_group 0;" in k["ptx"] and "cvt.rn." in k["ptx"]
    else:
        buffer = ts.RING_SLOTS * 16 * 32 * ts.RING_WARPS
        assert buffer <= k["shared"] <= 227 * 1024
        assert f"cp.async.wait_group {ts.RING_SLOTS - 2};" in k["ptx"]  # (a y and a dy copy per chunk)
    slot = 16 * 32 * (ts.HYBRID_WARPS if kernel == "fwd" else ts.RING_WARPS)
    assert all(o % slot == 0 for o in k["offsets"] if o < buffer), k["offsets"]  # the buffer's own slots
    assert any(o >= buffer for o in k["offsets"]), k["offsets"]  # the scratch, past the buffer
    assert "cp.async.cg.shared.global" in k["ptx"]
    if k["usage"]:
        assert "LOCAL:0 " in k["usage"] or k["usage"].rstrip().endswith("LOCAL:0"), k["usage"]  # no spills
        if kernel == "fwd":  # (and no stack frame: the shared part is not kept in registers across passes)
            assert int(re.search(r"REG:(\d+)", k["usage"]).group(1)) <= ts.HYBRID_MAX_REGS, k["usage"]
            assert "STACK:0 " in k["usage"], k["usage"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape,dtype,scale,view", [
    ((300, 65536), torch.bfloat16, 1.0, None), ((37, 40000), torch.float16, -0.5, None),
    ((5, 65536), torch.bfloat16, 0.3, None), ((200, 32776), torch.bfloat16, 2.0, None),
    ((140, 65536), torch.bfloat16, 1.0, "strided"), ((3, 65535), torch.bfloat16, 1.0, None),
    ((64, 16392), torch.bfloat16, 0.7, None), ((50, 20000), torch.float16, -1.0, None),
    ((9, 32768), torch.bfloat16, 1.0, None),
])
def test_hybrid_path_on_the_gpu(ts, shape, dtype, scale, view, seeded):
    """The hybrid forward against the float64 reference: whole and partial shared parts, rows just past
    the registers' part, fewer rows than SMs, a negative scale, strided rows (a column slice), two
    equal maxima of 1e30 (fp16: 6e4; one in each part), rows with no finite score, and an unaligned
    row (65535 columns: the next-best plan)."""
    if view == "strided":
        x = random_scores((shape[0], shape[1] + 64), dtype, DEVICE, gen=seeded)[:, 16:16 + shape[1]]
    else:
        x = random_scores(shape, dtype, DEVICE, gen=seeded)
    x[0] = -float("inf") if scale > 0 else float("inf")  # no finite score: zeros
    big = (1e30 if dtype == torch.bfloat16 else 6e4) * (1 if scale > 0 else -1)  # (fp16 tops out at 65504)
    x[1, 7], x[1, -3] = big, big
    p = ts.plan(shape[1], x.element_size())
    assert p.hybrid and (ts.gluon_unusable(x, False, p) is None) == (shape[1] % 8 == 0)
    y = ts.launch_fwd(x, scale, False)
    ref = kernels.reference_softmax(x, scale=scale)
    assert torch.equal(y[0].cpu(), torch.zeros(shape[1], dtype=dtype))
    assert y[1, 7].item() == 0.5 and y[1, -3].item() == 0.5
    assert kernels.relative_error(y[2:], ref[2:]) <= FWD_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape,dtype,view", [
    ((300, 65536), torch.bfloat16, None), ((37, 40000), torch.float16, None), ((5, 65536), torch.bfloat16, None),
    ((1, 65536), torch.bfloat16, None), ((200, 32776), torch.bfloat16, None), ((140, 65536), torch.bfloat16, "strided"),
    ((3, 65535), torch.bfloat16, None),
])
def test_ring_backward_on_the_gpu(ts, shape, dtype, view, seeded):
    """The ring backward (a row over a pair of programs that trade their halves' partial dot
    products) against the float64 reference: whole and partial chunks, one row, fewer rows than
    pairs, strided dy (a column slice), an unaligned row (the next-best plan); rows whose y is all
    zeros give dx = 0; and a second call (fresh exchange workspace) gives the same dx."""
    x = random_scores(shape, dtype, DEVICE, gen=seeded)
    y = ts.launch_fwd(x, 0.7, False)
    if shape[0] > 1:
        y[1] = 0
    if view == "strided":
        dy = random_scores((shape[0], shape[1] + 64), dtype, DEVICE, gen=seeded)[:, 16:16 + shape[1]]
    else:
        dy = random_scores(shape, dtype, DEVICE, gen=seeded)
    p = ts.plan(shape[1], y.element_size(), backward=True)
    assert p.ring and (ts.gluon_unusable(y, False, p, dy) is None) == (shape[1] % 8 == 0)
    dx = ts.launch_bwd(y, dy, 0.7, False)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.7)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[dtype]
    if shape[0] > 1:
        assert torch.equal(dx[1].cpu(), torch.zeros(shape[1], dtype=dtype))
    assert torch.equal(ts.launch_bwd(y, dy, 0.7, False), dx)


def test_cpu_tensor_without_interpreter_is_a_clear_error(ts, monkeypatch):
    monkeypatch.setattr(ts, "interpreter_enabled", lambda: False)
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


def test_fullgraph_compile_of_a_model_using_it():
    from harness.methods import apply_accel
    from models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)).to(DEVICE)
    idx = torch.randint(0, 64, (2, 16), device=DEVICE)
    ref_logits, _ = model(idx)
    apply_accel(model, "materialized", "triton")
    compiled = torch.compile(model, fullgraph=True)  # a graph break would raise
    logits, loss = compiled(idx, idx)
    loss.backward()
    assert torch.allclose(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
