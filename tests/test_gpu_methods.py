"""GPU tests (marked `gpu`, skipped without CUDA) of the fused methods at full sizes: the Triton and
the CUDA extension kernels against float64, op checks, full-graph compile, and training parity."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from tests.helpers import BWD_TOL, FWD_TOL, assert_close_to_reference, check_method, random_scores

pytestmark = pytest.mark.gpu
FUSED = ["triton", "cuda"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _xin(shape, dtype, layout="contiguous"):
    g = torch.Generator().manual_seed(hash((shape, str(dtype), layout)) % 2**31)
    if layout == "misaligned":  # data pointer off by one element: no 16-byte vector loads
        *lead, n = shape
        return random_scores((*lead, n + 1), dtype, "cuda", gen=g)[..., 1:]
    if layout == "transposed":
        *lead, a, b = shape
        return random_scores((*lead, b, a), dtype, "cuda", gen=g).transpose(-1, -2)
    return random_scores(shape, dtype, "cuda", gen=g)


SHAPES = [
    ((4096, 1), False, "contiguous"),
    ((999, 7), False, "contiguous"),
    ((64, 127), False, "contiguous"),
    ((64, 128), False, "contiguous"),
    ((64, 129), False, "contiguous"),
    ((32, 1024), False, "contiguous"),
    ((16, 4095), False, "contiguous"),
    ((16, 4096), False, "contiguous"),
    ((8, 16384), False, "contiguous"),
    ((8, 32768), False, "contiguous"),
    ((4, 65536), False, "contiguous"),
    ((4, 100003), False, "contiguous"),
    ((2, 262144), False, "contiguous"),
    ((2, 300000), False, "contiguous"),
    ((3, 40000), False, "contiguous"),
    ((2, 12, 1024, 1024), True, "contiguous"),
    ((4, 100, 300), True, "contiguous"),
    ((4, 300, 100), True, "contiguous"),
    ((2, 3, 2048, 2048), True, "contiguous"),
    ((2, 5000, 5000), True, "contiguous"),
    ((8, 1024), False, "misaligned"),
    ((2, 64, 512), True, "misaligned"),
    ((3, 256, 256), True, "transposed"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: f"{'x'.join(map(str, c[0]))}{'-causal' if c[1] else ''}-{c[2]}")
@pytest.mark.parametrize("method", FUSED)
def test_full_size_matches_float64(method, case, dtype):
    shape, causal, layout = case
    floors: list = []
    fwd, bwd = check_method(method, _xin(shape, dtype, layout), scale=0.125, causal=causal, floors=floors)
    assert_close_to_reference(fwd, bwd, tuple(floors), dtype)


@pytest.mark.parametrize("method", FUSED)
def test_every_output_element_is_written(method):
    # poison the allocator's next blocks: an unwritten element would keep NaN
    for shape in [(257, 3000), (3, 70000), (2, 4, 33, 33)]:
        torch.cuda.empty_cache()
        junk = torch.full((sum(torch.Size(shape).numel() for _ in range(4)),), float("nan"), device="cuda")
        del junk
        y = kernels.softmax(torch.randn(shape, device="cuda"), causal=len(shape) > 2, method=method)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("method", FUSED)
def test_backward_never_writes_into_incoming_gradient(method):
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = kernels.softmax(x, scale=0.5, method=method)
    dy = torch.randn_like(y)
    keep = dy.clone()
    y.backward(dy)
    assert torch.equal(dy, keep)


def test_cuda_rejects_cpu_tensors_and_mixed_devices():
    from kernels.methods.cuda import prepare

    prepare()
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        kernels.softmax(torch.randn(4, 8), method="cuda")
    y = torch.softmax(torch.randn(4, 8, device="cuda"), -1)
    with pytest.raises(RuntimeError, match="dy must be a CUDA tensor, got one on cpu"):
        torch.ops.softmax_harness_cuda.softmax_bwd(y, torch.randn(4, 8), 1.0, False)
    with pytest.raises(RuntimeError, match="y must be a CUDA tensor, got one on cpu"):
        torch.ops.softmax_harness_cuda.softmax_bwd(y.cpu(), y, 1.0, False)


def test_cuda_code_paths_by_row_length():
    from kernels.methods.cuda import code_path

    expected = {  # (dtype, backward): {N: path}
        (torch.bfloat16, False): {1024: "register", 16384: "register", 16385: "register", 32768: "register",
                                  32769: "hybrid", 49152: "hybrid", 49160: "hybrid", 65536: "hybrid", 65537: "split",
                                  128 * 16384: "split", 128 * 16384 + 1: "stream"},  # > kMaxSplits slices
        (torch.bfloat16, True): {8192: "register", 8193: "register", 16384: "register", 32768: "register",
                                 32769: "cluster", 131072: "cluster", 131073: "split", 128 * 8192: "split", 128 * 8192 + 1: "stream"},
        (torch.float32, False): {16384: "register", 16385: "cluster-persist", 32768: "cluster-persist",
                                 32769: "split"},
        (torch.float32, True): {4096: "register", 4097: "persist", 8192: "persist", 8193: "cluster",
                                65536: "cluster", 65537: "split"},
    }
    for (dtype, backward), paths in expected.items():
        for n, path in paths.items():
            assert code_path(dtype, backward, n) == path, (dtype, backward, n)
    assert code_path(torch.bfloat16, False, 1024, aligned=False) == "stream"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,causal", [((3, 8200), False), ((2, 5, 20000), False), ((1, 3, 40000), True),
                                          ((1, 9000, 9000), True), ((64, 100000), False), ((1000, 16384), False),
                                          ((300, 65536), False), ((1, 2, 600, 60000), True), ((8, 200000), False),
                                          ((2, 64, 32776), True), ((2, 3, 30001), True)])
def test_cuda_long_row_paths(shape, causal, dtype):
    """Long rows: the register path at its longest (16-bit rows kept packed), the 16-bit forward's hybrid
    path (half the row in registers, the rest in shared memory; (2, 64, 32776) causal: rows whose
    prefix ends in either half, at and across the boundary), the persistent path (rows prefetched into
    shared memory; more rows than blocks, so blocks loop), on one CTA or (fp32 forward) a cluster of
    two exchanging their partials, the backward's cluster path (a row over 2-8 CTAs exchanging once),
    and the split path (a row over several blocks meeting in global memory): odd lengths, causal rows
    (including slices that are entirely masked), many rows at once, twice in a row (the split
    workspace's counters restart from zero)."""
    from kernels.methods.cuda import code_path

    rows = math.prod(shape[:-1])
    paths = {code_path(dtype, bwd, shape[-1], rows=rows) for bwd in (False, True)}
    assert paths <= {"register", "hybrid", "persist", "cluster-persist", "cluster", "split"}
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(2):
        x = (torch.randn(shape, device="cuda", generator=g) * 3).to(dtype).requires_grad_(True)
        y = kernels.softmax(x, scale=0.5, causal=causal, method="cuda")
        ref = kernels.reference_softmax(x.detach(), scale=0.5, causal=causal)
        assert kernels.relative_error(y, ref) <= FWD_TOL[dtype]
        dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
        (dx,) = torch.autograd.grad(y, x, dy)
        dref = kernels.reference_softmax_backward(y.detach(), dy, scale=0.5)
        assert kernels.relative_error(dx, dref) <= BWD_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1000, 20000, 50000, 100000])
def test_cuda_scales_and_special_values_on_every_forward_path(n, dtype):
    """The forward's on-chip paths (register, packed register, hybrid, cluster-persist, split: by N
    and dtype) read masked columns as a fill whose scaled score is -inf: right for any normal, finite
    scale, negative ones too; scale 0 and subnormal scales take the stream path. Special values keep their meaning:
    -inf entries get 0, a NaN or +inf entry makes its row NaN, an all -inf row gives zeros."""
    g = torch.Generator(device="cuda").manual_seed(n)
    x = (torch.randn(2, 8, n, device="cuda", generator=g) * 3).to(dtype)
    for scale in (0.3, -0.7, 0.0, 1e-39):
        for causal in (False, True):
            y = kernels.softmax(x, scale=scale, causal=causal, method="cuda")
            ref = kernels.reference_softmax(x, scale=scale, causal=causal)
            assert kernels.relative_error(y, ref) <= FWD_TOL[dtype], (scale, causal)
            if causal:
                masked = torch.ones(8, n, dtype=torch.bool, device="cuda").triu(n - 8 + 1)
                assert (y[:, masked] == 0).all(), (scale, causal)
    z = x.clone()
    z[0, 0, :7] = float("-inf")
    z[0, 1, 5] = float("nan")
    z[0, 2, n - 1] = float("inf")
    z[0, 3] = float("-inf")
    for scale in (0.3, -0.7):  # scaled by -0.7, -inf entries become +inf (their row NaN), +inf -inf
        y = kernels.softmax(z, scale=scale, method="cuda")
        ref = kernels.reference_softmax(z, scale=scale)
        nan_rows = ref.isnan().all(-1)
        assert nan_rows[0, 1] and nan_rows[0, 2] == (scale > 0) and nan_rows[0, 0] == (scale < 0)
        assert torch.equal(y.isnan().all(-1), nan_rows), scale
        assert kernels.relative_error(y[~nan_rows], ref[~nan_rows]) <= FWD_TOL[dtype], scale
        if scale > 0:  # (scaled by -0.7 the all -inf row is all +inf: NaN)
            assert (y[0, 3] == 0).all() and (y[0, 0, :7] == 0).all()
        else:
            assert y[0, 2, -1] == 0


def test_opchecks():
    x = torch.randn(2, 3, 64, 64, device="cuda", dtype=torch.bfloat16)
    y = torch.softmax(x.float(), -1).to(x.dtype)
    dy = torch.randn_like(y)
    kernels.get_method("cuda").prepare()
    torch.library.opcheck(torch.ops.softmax_harness.triton_softmax_fwd.default, (x, 0.125, True))
    torch.library.opcheck(torch.ops.softmax_harness.triton_softmax_bwd.default, (y, dy, 0.125, True))
    torch.library.opcheck(torch.ops.softmax_harness_cuda.softmax_fwd.default, (x, 0.125, True))
    torch.library.opcheck(torch.ops.softmax_harness_cuda.softmax_bwd.default, (y, dy, 0.125, True))


@pytest.mark.slow
@pytest.mark.parametrize("method", FUSED)
def test_fullgraph_compile_of_the_model(method):
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, context=256, n_layer=2, n_head=4, n_embd=128)).cuda()
    idx = torch.randint(0, 512, (4, 256), device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        ref, _ = model(idx)
    apply_accel(model, method)
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", torch.bfloat16):
        logits, loss = compiled(idx, idx)
    loss.backward()
    assert (logits.float() - ref.float()).norm() / ref.float().norm() < 2e-2


@pytest.mark.parametrize("method", FUSED)
def test_training_tracks_the_torch_loss_curve(method, tmp_path):
    from hydra import compose, initialize_config_dir

    from harness.config import CONF_DIR
    from harness.training import run_training

    def run(accel):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(
                config_name="config",
                overrides=[f"accel={accel}", "model=small", "model.n_layer=2", "trainer.max_steps=60",
                           "trainer.val_every=0", "logger=none"],
            )
        return run_training(cfg, tmp_path / accel)["loss_curve"]

    ref, got = run("torch"), run(method)
    diffs = [abs(a - b) for a, b in zip(ref, got)]
    assert max(diffs) < 0.05 * max(ref), f"max loss difference {max(diffs):.4f}"
    assert got[-1] < 0.7 * got[0]


@pytest.mark.parametrize("method", FUSED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1000, 20000, 50000, 100000, 300000])
def test_parts_of_a_row_with_nothing_unmasked_beside_very_negative_scores(method, n, dtype):
    """Every forward path by N (register, packed, hybrid, cluster, split, long): a warp, slice or chunk
    holding only masked or -inf columns takes its reference as 0; where every kept score of the row is
    far below it (-300 at scale 1: exp2 of +433 overflows) its outputs must stay 0 (0 x inf was NaN:
    the merged register/split/cluster forwards of both methods), the kept columns uniform."""
    x = torch.full((2, 8, n), -300.0, device="cuda", dtype=dtype)
    for causal in (False, True):
        z = x.clone()
        if not causal:
            z[0, :, 9:] = float("-inf")  # one row block of -inf tails, one of finite rows
        y = kernels.softmax(z, scale=1.0, causal=causal, method=method)
        ref = kernels.reference_softmax(z, scale=1.0, causal=causal)
        assert not y.isnan().any(), causal
        assert kernels.relative_error(y, ref) <= FWD_TOL[dtype] and (y[ref == 0] == 0).all(), causal
