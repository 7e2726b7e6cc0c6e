"""The Triton method's kernels, path by path: long and split rows (forced small), every forward path on
extreme scores, the persistent and causal variants, the fill kernel's scales and special values; the
Gluon kernels compiled for sm_90 (no GPU needed) and run on a GPU.

On a CPU these run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.runtime import availability
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from tests.helpers import BWD_TOL, FWD_TOL, check_method, random_scores

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["long", "split"])
def forced_path(request, monkeypatch):
    """long: rows longer than 16 take the long (streaming) path, in chunks of 8. split: rows longer
    than 8 take the split path, in chunks of 8 (up to 8 chunks; longer: the long path)."""
    if request.param == "long":
        monkeypatch.setattr(tp, "MAX_TILE_N", 16)
        monkeypatch.setattr(tp, "LONG_BLOCK_N", 8)
    else:
        monkeypatch.setattr(tp, "SPLIT_ABOVE_N", 8)
        monkeypatch.setattr(tp, "SPLIT_BLOCK_N", 8)
        monkeypatch.setattr(tp, "MAX_SPLITS", 8)
        monkeypatch.setattr(tp, "_SPLIT_FROM", {False: 0, True: 0})
    tp.clear_plan_cache()  # the launch path caches plans: forget those of the real limits
    yield request.param
    tp.clear_plan_cache()


# (float16: as bfloat16; float32: the same paths without the rounding to 16 bits: the slow set)
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), pytest.param(torch.float16, marks=pytest.mark.slow), torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "shape,causal",
    [((3, 37), False), ((2, 64), False), ((2, 20, 20), True), ((2, 9, 30), True), ((2, 30, 9), True),
     ((1, 17), False), ((1, 9), False)],
)
def test_long_and_split_paths_match_reference(forced_path, shape, causal, dtype, seeded):
    """The streaming path, and a row over several programs (in the interpreter: partials first, then
    outputs, two launches)."""
    assert getattr(tp.plan(shape[-1], 4), forced_path) or (forced_path == "long" and shape[-1] <= 16)
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
def test_every_forward_path_takes_huge_scores(path, scale):
    """Scores of 1e30 (two equal maxima in different chunks) and of 1e4: every forward kernel takes
    its exponents relative to the row's max score exactly (on a GPU, exp2(fma(x, c, -round(max * c)))
    would shift them all by the max's rounding error, which overflows exp2 at this magnitude). The
    hybrid path (GPU only, longer rows) falls back to the tile path here; the GPU tests below take it."""
    plan = {"tile": tp.Plan(False, 64, 2, 1), "fill": tp.Plan(False, 64, 2, 1, fill=True), "persistent": tp.Plan(False, 64, 1, 1, stages=2),
            "long": tp.Plan(True, 16, 1, 1), "split": tp.Plan(False, 16, 1, 1, split=True),
            "hybrid": tp.Plan(False, 64, 1, 1, hybrid=True)}[path]
    x = torch.full((3, 64), -float("inf") if scale > 0 else float("inf"), device=DEVICE)  # x * scale = -inf
    x[0, 3], x[0, 40] = 1e30 * scale, 1e30 * scale  # the row's maximum of x * scale, twice
    x[1] = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(DEVICE) * 1e4
    x[2, :5] = 1.0
    y = launch_fwd(x, scale, False, plan).cpu()
    assert y[0, 3].item() == 0.5 and y[0, 40].item() == 0.5 and y[0].sum().item() == 1.0
    assert kernels.relative_error(y[1:], kernels.reference_softmax(x[1:].cpu(), scale=scale)) <= 1e-5
    assert torch.equal(y[2, 5:], torch.zeros(59))


@pytest.mark.parametrize("shape,causal", [((9, 37), False), ((2, 20, 20), True), ((2, 9, 30), True), ((2, 30, 9), True)])
def test_persistent_path_matches_reference(shape, causal, seeded):
    """Persistent programs looping over rows (pipelined on a GPU), forward and backward."""
    x = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    p = tp.Plan(False, 64, 1, 1, stages=2)
    y = launch_fwd(x, 0.5, causal, p)
    assert kernels.relative_error(y, kernels.reference_softmax(x, scale=0.5, causal=causal)) <= FWD_TOL[torch.bfloat16]
    dy = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    dx = launch_bwd(y, dy, 0.5, causal, p)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.5)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[torch.bfloat16]


# (float16: as bfloat16; float32: the same paths without the rounding to 16 bits: the slow set)
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow), pytest.param(torch.float32, marks=pytest.mark.slow)], ids=str)
@pytest.mark.parametrize("variant", ["reload", "narrow"])
@pytest.mark.parametrize("shape,causal,rows", [((9, 37), False, 2), ((2, 20, 20), True, 1), ((2, 9, 30), True, 4),
                                              ((2, 30, 9), True, 2)])
def test_backward_tile_reload_and_narrow_give_the_held_rows_result(shape, causal, rows, variant, dtype, seeded):
    """The backward tile path reading y and dy again for dx (``Plan.reload``), or holding them as loaded and
    widening them again (``Plan.narrow``; fp32 rows are widened as they are), computes what the plan that
    holds the widened rows does, bit for bit (the same operations on the same values), masked columns and
    rows past the end included, and matches the reference. Compiled for a GPU, fp32 rows to a few units in
    the last place: ptxas may contract y * dy into the dot's adds in one kernel and not in the other (seen on
    an H100 with reload at (9, 37)); the 16-bit rows' rounding hides that."""
    y = launch_fwd(random_scores(shape, dtype, DEVICE, gen=seeded), 0.5, causal, tp.Plan(False, 64, 1, 1))
    dy = random_scores(shape, dtype, DEVICE, gen=seeded)
    held = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, 64, rows, 1))
    again = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, 64, rows, 1, **{variant: True}))
    if dtype == torch.float32 and again.is_cuda:
        atol = 4 * torch.finfo(torch.float32).eps * held.abs().max().item()
        torch.testing.assert_close(again, held, rtol=4 * torch.finfo(torch.float32).eps, atol=atol)
    else:
        assert torch.equal(again, held)
    assert kernels.relative_error(again, kernels.reference_softmax_backward(y, dy, scale=0.5)) <= BWD_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("narrow", [False, True])
def test_backward_tile_of_whole_rows_drops_the_masks_and_keeps_the_result(narrow, dtype, seeded, monkeypatch):
    """Rows that fill their tile (not causal, n_cols = BLOCK_N, ROWS dividing the rows) take the tile kernel's
    WHOLE branch (no masks): the launch asks for it exactly there, and it computes what the masked kernel does
    on the same rows, bit for bit (compiled fp32 rows to a few units in the last place, as above)."""
    from kernels.methods.triton.softmax import launch as tl_launch

    seen = []
    real = tl_launch._run
    monkeypatch.setattr(tl_launch, "_run", lambda kernel, grid, args, meta, dev: (seen.append(meta),
                                                                                  real(kernel, grid, args, meta, dev)))
    y = launch_fwd(random_scores((8, 64), dtype, DEVICE, gen=seeded), 0.5, False, tp.Plan(False, 64, 1, 1))
    dy = random_scores((8, 64), dtype, DEVICE, gen=seeded)
    plan = tp.Plan(False, 64, 2, 1, narrow=narrow)
    whole = launch_bwd(y, dy, 0.5, False, plan)
    assert seen[-1]["WHOLE"] is True
    from kernels.methods.triton.softmax import tile
    masked = torch.empty_like(whole)
    meta = dict(seen[-1], WHOLE=False)
    tile._bwd_tile_kernel[(4,)](y, dy, masked, 8, 64, dy.stride(0), dy.stride(1), 1, 0, 0.5, **meta)
    if dtype == torch.float32 and whole.is_cuda:
        eps = torch.finfo(torch.float32).eps
        torch.testing.assert_close(whole, masked, rtol=4 * eps, atol=4 * eps * masked.abs().max().item())
    else:
        assert torch.equal(whole, masked)
    assert kernels.relative_error(whole, kernels.reference_softmax_backward(y, dy, scale=0.5)) <= BWD_TOL[dtype]
    # ragged rows, rows the programs do not divide, causal rows, and reload plans (which read the rows twice) keep
    # the masked kernel
    for shape, causal, rows, reload in (((8, 60), False, 2, False), ((7, 64), False, 2, False),
                                        ((2, 8, 64), True, 2, False), ((8, 64), False, 2, True)):
        yy = launch_fwd(random_scores(shape, dtype, DEVICE, gen=seeded), 0.5, causal, tp.Plan(False, 64, 1, 1))
        launch_bwd(yy, random_scores(shape, dtype, DEVICE, gen=seeded), 0.5, causal,
                   tp.Plan(False, 64, rows, 1, reload=reload))
        assert seen[-1]["WHOLE"] is False, (shape, causal, reload)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_backward_narrow_gives_the_held_rows_result(causal, dtype, seeded):
    """The persistent backward (rows pipelined through shared memory) holding y and dy as loaded
    (``Plan.narrow``) gives the widened rows' gradient bit for bit."""
    shape = (2, 13, 40)
    y = launch_fwd(random_scores(shape, dtype, DEVICE, gen=seeded), 0.5, causal, tp.Plan(False, 64, 1, 1))
    dy = random_scores(shape, dtype, DEVICE, gen=seeded)
    held = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, 64, 1, 2, stages=2))
    narrow = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, 64, 1, 2, stages=2, narrow=True))
    assert torch.equal(narrow, held)
    assert kernels.relative_error(narrow, kernels.reference_softmax_backward(y, dy, scale=0.5)) <= BWD_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n,warps,stages", [(32768, 32, 2), (16384, 16, 2)])  # (3 stages at 32768: 262 KB)
def test_persistent_backward_narrow_on_the_gpu(n, warps, stages, seeded):
    """On the GPU: the persistent backward holding y and dy 16-bit gives the widened rows' gradient bit for
    bit at the lengths the sweep tries it."""
    y = torch.softmax(random_scores((300, n), torch.float32, "cuda", gen=seeded), -1).to(torch.bfloat16)
    dy = random_scores((300, n), torch.bfloat16, "cuda", gen=seeded)
    held = launch_bwd(y, dy, 0.5, False, tp.Plan(False, n, 1, warps, stages=stages))
    narrow = launch_bwd(y, dy, 0.5, False, tp.Plan(False, n, 1, warps, stages=stages, narrow=True))
    assert torch.equal(narrow, held)


def test_reload_and_narrow_exclude_each_other():
    with pytest.raises(ValueError, match="reload=True, narrow=True"):
        tp.Plan(False, 64, 1, 1, reload=True, narrow=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["reload", "narrow"])
@pytest.mark.parametrize("n,warps,causal", [(8192, 16, False), (16384, 16, False), (32768, 32, False), (1000, 4, False),
                                            (1024, 4, True)])
def test_backward_tile_reload_and_narrow_on_the_gpu(n, warps, causal, variant, seeded):
    """On the GPU (reload's second loads with their own cache modifier; narrow's second widening of a
    value the compiler cannot prove equal): each gives the held rows' gradient bit for bit at the lengths
    the sweep tries it."""
    shape = (2, n, n) if causal else (64, n)
    y = torch.softmax(random_scores(shape, torch.float32, "cuda", gen=seeded), -1).to(torch.bfloat16)
    dy = random_scores(shape, torch.bfloat16, "cuda", gen=seeded)
    block = tp._next_pow2(n)
    held = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, block, 1, warps))
    again = launch_bwd(y, dy, 0.5, causal, tp.Plan(False, block, 1, warps, **{variant: True}))
    assert torch.equal(again, held)


_RELOAD_REGS = """
import torch
from triton.backends.compiler import GPUTarget
from harness.bench.tuning.flash_compile_check import compile_call
from kernels.methods.triton.softmax import tile
y = torch.empty(16, dtype=torch.bfloat16)
for n, warps in ((16384, 16), (32768, 32)):
    for variant in ("held", "reload", "narrow"):
        kw = dict(BLOCK_N=n, ROWS=1, CAUSAL=False, ROUND_MASK=True, RELOAD=variant == "reload",
                  NARROW=variant == "narrow", num_warps=warps)
        r = compile_call(tile._bwd_tile_kernel, (y, y, y, 8192, n, n, 1, 1, 0, 1.0), kw, GPUTarget("cuda", 90, 32))
        print(n, variant, r["regs"], r["global_loads"], r["stack"])
for variant in ("held", "narrow"):  # the persistent path's, as the table has it at 32768
    kw = dict(BLOCK_N=32768, CAUSAL=False, STAGES=2, NARROW=variant == "narrow", num_warps=32)
    r = compile_call(tile._bwd_persist_kernel, (y, y, y, 8192, 32768, 32768, 1, 1, 0, 1.0), kw, GPUTarget("cuda", 90, 32))
    print(-32768, variant, r["regs"], r["global_loads"], r["stack"])
"""


def test_backward_tile_reload_and_narrow_compile_to_fewer_registers_for_sm90():
    """Compiled for sm_90 (no GPU; a subprocess without the interpreter). At 16384 columns on 16 warps: with
    ``reload`` the kernel issues its row's loads twice (the compiler did not merge them), with ``narrow``
    once, and either fits two programs of 512 threads in an SM's 65536 registers (at most 64 a thread),
    where the kernel that holds the widened row does not. At 32768 on 32 warps (64 registers at most) the
    held row spills and narrow's does not, in the tile kernel and in the persistent one."""
    from tests.compiled_report import compile_run

    run = compile_run(["-c", _RELOAD_REGS], 600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = {(int(f[0]), f[1]): tuple(int(v) for v in f[2:]) for f in (line.split() for line in run.stdout.splitlines())
           if len(f) == 5 and f[1] in ("held", "reload", "narrow")}
    (held_regs, held_loads, _), (again_regs, again_loads, _) = got[16384, "held"], got[16384, "reload"]
    narrow_regs, narrow_loads, _ = got[16384, "narrow"]
    assert again_loads == 2 * held_loads and narrow_loads == held_loads, got
    assert again_regs <= 64 < held_regs and narrow_regs <= 64, got
    assert got[32768, "held"][2] > 0 and got[32768, "narrow"][2] == 0, got
    assert got[-32768, "held"][2] > 0 and got[-32768, "narrow"][2] == 0, got  # (the persistent path: likewise)


@pytest.mark.parametrize("variant", ["whole-vector loads", "exact loads", "fill", "fill, 2 warps"])
@pytest.mark.parametrize("shape", [(2, 20, 20), (2, 9, 30), (2, 30, 9), (3, 7, 13)])
def test_causal_tile_variants_match_reference(shape, variant, seeded):
    """Every causal forward variant the sweep may pick (the tile kernel's exact or whole-vector prefix
    loads; the fill kernel, rows per program not dividing the rows, a row over two warps) gives the
    reference result, fully masked rows included."""
    x = random_scores(shape, torch.bfloat16, DEVICE, gen=seeded)
    p = {"whole-vector loads": tp.Plan(False, 32, 2, 1), "exact loads": tp.Plan(False, 32, 2, 1, round_mask=False),
         "fill": tp.Plan(False, 32, 4, 1, fill=True), "fill, 2 warps": tp.Plan(False, 32, 1, 2, fill=True)}[variant]
    y = launch_fwd(x, 0.5, True, p)
    ref = kernels.reference_softmax(x, scale=0.5, causal=True)
    assert kernels.relative_error(y, ref) <= FWD_TOL[torch.bfloat16]
    masked = torch.ones(shape[-2], shape[-1], dtype=torch.bool).triu(shape[-1] - shape[-2] + 1)
    assert (y.cpu()[..., masked] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fill_kernel_scales_and_special_values(dtype):
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
    p = tp.plan(21, x.element_size(), causal=True)
    assert p.fill
    masked = torch.ones(12, 21, dtype=torch.bool).triu(21 - 12 + 1)
    for scale in (0.3, -0.7, 1e-30, 0.0):
        y = launch_fwd(x.to(DEVICE), scale, True, p).cpu()
        ref = kernels.reference_softmax(x, scale=scale, causal=True).to(dtype)
        assert torch.equal(y.isnan(), ref.isnan()), scale
        ok = ~ref.isnan()
        assert kernels.relative_error(y[ok], ref[ok]) <= FWD_TOL[dtype], scale
        finite_rows = ~ref.isnan().any(-1, keepdim=True)
        assert (y[finite_rows & masked] == 0).all(), scale
    y = launch_fwd(x.to(DEVICE), 0.3, True, p).cpu()
    assert torch.equal(y[0, 2], torch.zeros(21, dtype=dtype))  # kept keys all -inf: zeros
    assert y[1, 4].isnan().all() and y[1, 7].isnan().all() and not y[1, 3].isnan().any()
    assert y[0, 5, :3].eq(0).all() and y[0, 5].sum().item() == pytest.approx(1.0, rel=1e-2)
    assert tp.fill_scale_ok(1e-30 * tp.LOG2E) and not tp.fill_scale_ok(0.0) and not tp.fill_scale_ok(float("inf"))
    with pytest.raises(ValueError, match="forward path"):
        launch_bwd(y, y, 0.3, True, p)


_GLUON_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.triton.softmax import gluon as gk, plan as tp

kernel, dtype, even = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
div16 = lambda n: {(i,): [["tt.divisibility", 16]] for i in range(n)}  # the first n pointers: 16-byte aligned
if kernel == "fwd":  # the hybrid forward: 65536 columns (12 shared vectors per thread), or 49152 (8) and partial
    sig = {"X": f"*{dtype}", "Y": f"*{dtype}", "XW": "*i32", "YW": "*i32", "n_vec": "i32", "stride_v": "i32",
           "scale_log2e": "fp32", "zero": "i32", "NR": "constexpr", "NS": "constexpr", "EVEN": "constexpr", "BF16": "constexpr"}
    src = GluonASTSource(fn=gk._fwd_hybrid_kernel, signature=sig, attrs=div16(4),
                         constexprs={"NR": tp.HYBRID_REG_VECS, "NS": 12 if even else 8, "EVEN": even,
                                     "BF16": dtype == "bf16"})
    options = {"num_warps": tp.HYBRID_WARPS, "maxnreg": tp.HYBRID_MAX_REGS}
else:
    sig = {"Y": f"*{dtype}", "DY": f"*{dtype}", "DX": f"*{dtype}", "XCH": "*i64", "n_rows": "i32", "n_vec": "i32",
           "stride_v": "i32", "scale": "fp32", "VEC": "constexpr", "NCH": "constexpr", "SLOTS": "constexpr"}
    src = GluonASTSource(fn=gk._bwd_pair_ring_kernel, signature=sig, attrs=div16(3),
                         constexprs={"VEC": 8, "NCH": 4 if even else 3, "SLOTS": tp.RING_SLOTS})
    options = {"num_warps": tp.RING_WARPS}
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
print(json.dumps(report(k)))
"""


@pytest.mark.parametrize("kernel,dtype,even", [  # (one compile of each kernel in the default set, ~3 s each)
    ("fwd", "bf16", True), pytest.param("fwd", "fp16", False, marks=pytest.mark.slow),
    pytest.param("bwd", "bf16", True, marks=pytest.mark.slow), ("bwd", "fp16", False)])
def test_gluon_kernels_compile_for_sm90_with_their_buffer_at_the_start_of_shared_memory(kernel, dtype, even):
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

    if availability.GLUON_ERROR:
        pytest.skip(availability.GLUON_ERROR)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _GLUON_COMPILE, kernel, dtype, str(int(even))], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    k = json.loads(run.stdout.strip().splitlines()[-1])
    if kernel == "fwd":
        buffer = (12 if even else 8) * 16 * 32 * tp.HYBRID_WARPS
        assert buffer <= k["shared"] <= 227 * 1024 // 2
        assert "cp.async.wait_group 0;" in k["ptx"] and "cvt.rn." in k["ptx"]
    else:
        buffer = tp.RING_SLOTS * 16 * 32 * tp.RING_WARPS
        assert buffer <= k["shared"] <= 227 * 1024
        assert f"cp.async.wait_group {tp.RING_SLOTS - 2};" in k["ptx"]  # (a y and a dy copy per chunk)
    slot = 16 * 32 * (tp.HYBRID_WARPS if kernel == "fwd" else tp.RING_WARPS)
    assert all(o % slot == 0 for o in k["offsets"] if o < buffer), k["offsets"]  # the buffer's own slots
    assert any(o >= buffer for o in k["offsets"]), k["offsets"]  # the scratch, past the buffer
    assert "cp.async.cg.shared.global" in k["ptx"]
    if k["usage"]:
        assert "LOCAL:0 " in k["usage"] or k["usage"].rstrip().endswith("LOCAL:0"), k["usage"]  # no spills
        if kernel == "fwd":  # (and no stack frame: the shared part is not kept in registers across passes)
            assert int(re.search(r"REG:(\d+)", k["usage"]).group(1)) <= tp.HYBRID_MAX_REGS, k["usage"]
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
def test_hybrid_path_on_the_gpu(shape, dtype, scale, view, seeded):
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
    p = tp.plan(shape[1], x.element_size())
    assert p.hybrid and (tp.gluon_unusable(x, False, p) is None) == (shape[1] % 8 == 0)
    y = launch_fwd(x, scale, False)
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
def test_ring_backward_on_the_gpu(shape, dtype, view, seeded):
    """The ring backward (a row over a pair of programs that trade their halves' partial dot
    products) against the float64 reference: whole and partial chunks, one row, fewer rows than
    pairs, strided dy (a column slice), an unaligned row (the next-best plan); rows whose y is all
    zeros give dx = 0; and a second call (fresh exchange workspace) gives the same dx."""
    x = random_scores(shape, dtype, DEVICE, gen=seeded)
    y = launch_fwd(x, 0.7, False)
    if shape[0] > 1:
        y[1] = 0
    if view == "strided":
        dy = random_scores((shape[0], shape[1] + 64), dtype, DEVICE, gen=seeded)[:, 16:16 + shape[1]]
    else:
        dy = random_scores(shape, dtype, DEVICE, gen=seeded)
    p = tp.plan(shape[1], y.element_size(), backward=True)
    assert p.ring and (tp.gluon_unusable(y, False, p, dy) is None) == (shape[1] % 8 == 0)
    dx = launch_bwd(y, dy, 0.7, False)
    dref = kernels.reference_softmax_backward(y, dy, scale=0.7)
    assert kernels.relative_error(dx, dref) <= BWD_TOL[dtype]
    if shape[0] > 1:
        assert torch.equal(dx[1].cpu(), torch.zeros(shape[1], dtype=dtype))
    assert torch.equal(launch_bwd(y, dy, 0.7, False), dx)


@pytest.mark.parametrize("forced_path", ["split"], indirect=True)
@pytest.mark.parametrize("causal", [False, True])
def test_split_path_empty_chunks_beside_very_negative_scores(forced_path, causal):
    """A chunk holding only masked or -inf columns takes its reference as 0; where every kept score of
    the row is far below that (here -300, scale 1: exp2 of +433 overflows), its zeros must stay zeros
    (0 x inf was NaN) and the kept columns uniform."""
    x = torch.full((2, 20, 40), -300.0, device=DEVICE)
    if not causal:
        x[..., 9:] = float("-inf")  # chunks 2-5 of every row hold only -inf
    y = launch_fwd(x, 1.0, causal)
    ref = kernels.reference_softmax(x, scale=1.0, causal=causal)
    assert not y.isnan().any() and kernels.relative_error(y, ref) <= 1e-6
    assert (y[ref == 0] == 0).all()
