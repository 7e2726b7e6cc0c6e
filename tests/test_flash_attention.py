"""The flash method (kernels/methods/flash): output and the three gradients against float64, the
causal and boundary cases, layouts, dtypes, head dims, the errors, the torch ops (the launch plans and
the launch path: tests/test_flash_plans.py).

On the CPU these run in Triton's interpreter with tiny shapes and 16-wide blocks forced through the
plan (so every shape spans several blocks and ragged edges); the GPU-marked tests run full sizes.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.methods.flash.fwd import launch_fwd
from kernels.methods.flash.tiles import tma_eligible
from tests.helpers import assert_never_synchronizes
from tests.mismatch import where

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_FWD = plans.FwdPlan(block_m=16, block_n=16)
SMALL_BWD = plans.BwdPlan(block_m1=16, block_n1=16, block_m2=16, block_n2=16, pre_block=16)
SMALL = (SMALL_FWD, SMALL_BWD)


def make_qkv(B, H, tq, tk, d, dtype, layout="bhtd", dv=None, spread=1.0, seed=0, device=DEVICE):
    """q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv); layout 'bthd': views of (B, T, H, d)
    tensors transposed, as the model makes them; 'qkv': q, k, v slices of one fused projection."""
    g = torch.Generator().manual_seed(seed)
    dv = dv or d

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * spread).to(device=device, dtype=dtype)

    if layout == "qkv":
        assert tq == tk and dv == d
        qkv = rand(B, tq, 3 * H * d)  # the model's c_attn output, split and viewed
        q, k, v = (t.view(B, tq, H, d).transpose(1, 2) for t in qkv.split(H * d, dim=2))
    elif layout == "bthd":
        q, k, v = rand(B, tq, H, d).transpose(1, 2), rand(B, tk, H, d).transpose(1, 2), rand(B, tk, H, dv).transpose(1, 2)
    else:
        q, k, v = rand(B, H, tq, d), rand(B, H, tk, d), rand(B, H, tk, dv)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def run_and_compare(q, k, v, causal=True, scale=None, plan=SMALL):
    """Forward + backward through kernels.attention under ``plan``; returns the errors of out, dq, dk,
    dv against float64 (asserted within the attention tolerances) and the results."""
    with plans.override(*plan):
        out = kernels.attention(q, k, v, causal=causal, scale=scale, method="flash")
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
        out.backward(do)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:-1], v.shape[-1])
    ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*ref_in, scale=scale, causal=causal)
    ref.backward(do.double())
    got = [out, q.grad, k.grad, v.grad]
    want = [ref] + [t.grad for t in ref_in]
    for name, g in zip(("out", "dq", "dk", "dv"), got):
        assert torch.isfinite(g).all(), f"{name} has NaN or inf"
    errs = [kernels.relative_error(g, w) for g, w in zip(got, want)]
    # the attention tolerances, or 3x the error of merely rounding the exact result (long fp16 rows)
    tols = [max(kernels.ATTN_FWD_TOL[q.dtype], 3 * kernels.rounding_floor(want[0].detach(), q.dtype))]
    tols += [max(kernels.ATTN_BWD_TOL[q.dtype], 3 * kernels.rounding_floor(w, q.dtype)) for w in want[1:]]
    for name, e, t, g, w in zip(("out", "dq", "dk", "dv"), errs, tols, got, want):
        assert e <= t, f"{name}: relative error {e:.2e} > {t:.2e}; " + where(g, w, t * w.abs().max().item(), t)
    return errs, got


CASES = [  # (B, H, Tq, Tk, d, dtype, causal)
    (1, 2, 1, 1, 16, torch.float16, True),  # T = 1
    (1, 1, 1, 1, 32, torch.bfloat16, False),
    (2, 2, 37, 37, 16, torch.float16, True),  # odd T, not a multiple of the block
    (1, 2, 37, 37, 32, torch.bfloat16, False),
    (1, 2, 48, 48, 16, torch.bfloat16, True),  # a multiple of the block
    (1, 2, 20, 45, 32, torch.float16, True),  # Tq < Tk: bottom-right aligned diagonal
    (1, 2, 20, 45, 16, torch.bfloat16, False),
    (1, 2, 45, 20, 16, torch.float16, True),  # Tq > Tk: the first 25 queries see no key
    (1, 2, 45, 20, 32, torch.bfloat16, False),
    (1, 1, 3, 40, 16, torch.bfloat16, True),  # a few queries, many keys
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{'causal' if c[6] else 'full'}")
def test_matches_float64(case):
    B, H, tq, tk, d, dtype, causal = case
    run_and_compare(*make_qkv(B, H, tq, tk, d, dtype), causal=causal)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_head_dims(d, dtype):
    run_and_compare(*make_qkv(1, 1, 19, 19, d, dtype, seed=d), causal=True)


def test_padded_head_dims_and_a_different_value_dim():
    # d = 80 padded to 128 tiles with masked loads; v's head dim 24 (padded to 32) differs from d
    run_and_compare(*make_qkv(1, 2, 23, 23, 80, torch.float16, dv=24), causal=True)
    run_and_compare(*make_qkv(1, 1, 17, 30, 5, torch.bfloat16), causal=False)


@pytest.mark.parametrize("layout", ["bthd", "qkv"])
def test_strided_views_are_read_in_place(layout):
    q, k, v = make_qkv(2, 3, 21, 21, 16, torch.bfloat16, layout=layout)
    assert not q.is_contiguous()
    run_and_compare(q, k, v, causal=True)


def test_rows_with_no_key_get_zeros_and_zero_gradient():
    q, k, v = make_qkv(1, 2, 40, 13, 16, torch.float16)
    _, (out, dq, dk, dv) = run_and_compare(q, k, v, causal=True)
    empty = 40 - 13  # queries 0 .. 26 see no key
    assert (out[:, :, :empty] == 0).all() and (dq[:, :, :empty] == 0).all()
    assert out[:, :, empty:].abs().sum() > 0
    with plans.override(*SMALL):
        _, lse = launch_fwd(q.detach(), k.detach(), v.detach(), 0.25, True)
    assert torch.isposinf(lse[:, :, :empty]).all() and torch.isfinite(lse[:, :, empty:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_large_scores(dtype):
    """Inputs of magnitude ~30: scaled scores in the thousands, rows nearly one-hot; exp2 of the
    shifted scores must neither overflow nor lose the max. dq and dk of a nearly one-hot row are
    tiny differences dP - delta, and delta = rowsum(do * out) uses the stored (rounded) output, as
    every fused attention's backward does; in bf16 that rounding alone is ~0.2 of such a gradient.
    So dq and dk are checked against the float64 gradient with delta taken from the kernel's own out,
    out and dv against the exact float64 ones."""
    q, k, v = make_qkv(1, 2, 33, 33, 32, dtype, spread=30.0)
    with plans.override(*SMALL):
        out = kernels.attention(q, k, v, method="flash")
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, dtype)
        out.backward(do)
    q64, k64, v64, do64 = (t.detach().double() for t in (q, k, v, do))
    scale = q.shape[-1] ** -0.5
    p = kernels.reference_softmax(q64 @ k64.transpose(-2, -1), scale=scale, causal=True)
    ds = p * (do64 @ v64.transpose(-2, -1) - (do64 * out.detach().double()).sum(-1, keepdim=True))
    assert kernels.relative_error(out, p @ v64) <= kernels.ATTN_FWD_TOL[dtype]
    assert kernels.relative_error(v.grad, p.transpose(-2, -1) @ do64) <= kernels.ATTN_BWD_TOL[dtype]
    assert kernels.relative_error(q.grad, scale * ds @ k64) <= kernels.ATTN_BWD_TOL[dtype]
    assert kernels.relative_error(k.grad, scale * ds.transpose(-2, -1) @ q64) <= kernels.ATTN_BWD_TOL[dtype]


@pytest.mark.parametrize("scale", [None, 0.3, -0.2, 0.0])
def test_scale_given_or_default(scale):
    run_and_compare(*make_qkv(1, 1, 25, 25, 16, torch.float16, seed=3), causal=True, scale=scale)


def test_float32_is_exact_to_the_fp32_tolerance():
    errs, _ = run_and_compare(*make_qkv(1, 2, 29, 29, 16, torch.float32), causal=True)
    assert max(errs) < 1e-5  # full-precision dots (no tf32)


def test_clear_errors(monkeypatch):
    q, k, v = make_qkv(1, 1, 8, 8, 16, torch.float16)
    with pytest.raises(ValueError, match="no dropout.*sdpa"):
        kernels.attention(q, k, v, dropout_p=0.1, method="flash")
    big = torch.randn(1, 1, 8, 160, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="head dimensions up to 128"):
        kernels.attention(big, big, big, method="flash")
    with pytest.raises(TypeError, match="dtype"):  # float64 is outside the contract
        kernels.attention(q.double(), k.double(), v.double(), method="flash")
    if DEVICE == "cpu":  # outside the interpreter a CPU tensor is refused before any kernel
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="CUDA tensors"):
            kernels.attention(q, k, v, method="flash")


def test_opcheck():
    q, k, v = (t.detach() for t in make_qkv(1, 2, 20, 20, 16, torch.float16))
    with plans.override(*SMALL):
        torch.library.opcheck(torch.ops.softmax_harness.flash_attention_fwd.default, (q, k, v, 0.25, True))
        out, lse = torch.ops.softmax_harness.flash_attention_fwd(q, k, v, 0.25, True)
        do = torch.randn_like(out)
        torch.library.opcheck(torch.ops.softmax_harness.flash_attention_bwd.default,
                              (do, q, k, v, out, lse, 0.25, True))


@pytest.mark.slow
def test_fullgraph_compile_equals_eager():
    q, k, v = make_qkv(1, 2, 20, 20, 16, torch.bfloat16, layout="bthd")

    def f(q, k, v):
        return kernels.attention(q * 1.5, k, v, method="flash").float().square().sum()

    with plans.override(*SMALL):
        eager = f(q, k, v)
        grads = torch.autograd.grad(eager, (q, k, v))
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
        cgrads = torch.autograd.grad(compiled, (q, k, v))
    assert torch.equal(eager, compiled)
    for g, c in zip(grads, cgrads):
        assert torch.equal(g, c)


@pytest.mark.parametrize("layout", ["bhtd", "qkv"])
def test_gradients_take_their_inputs_layout_and_the_same_plan(layout):
    """Contiguous (B, H, T, d) leaves get their gradients in their own strides, taken by autograd as they are
    (a gradient in other strides than its dense leaf's is copied: three copies a backward, which held the eager
    kernels.attention(method="flash") on contiguous inputs at 0.81-0.89x cuDNN); the model's projection views get
    (B, T, H, d) ones. Both layouts get the same table plan and both are TMA-readable (neither falls back)."""
    q, k, v = make_qkv(1, 2, 17, 17, 16, torch.float32, layout=layout)
    seen = []
    q.register_hook(lambda g: seen.append((g.data_ptr(), g.stride())))  # (what q's accumulation is handed)
    with plans.override(*SMALL):
        kernels.attention(q, k, v, method="flash").sum().backward()
    want_stride = q.stride() if layout == "bhtd" else (17 * 2 * 16, 16, 2 * 16, 1)
    assert seen[0][1] == want_stride
    if layout == "bhtd":
        assert q.grad.data_ptr() == seen[0][0]  # (kept, not copied)
    big = [torch.empty(4, 12, 4096, 64, dtype=torch.bfloat16),
           torch.empty(4, 4096, 12, 64, dtype=torch.bfloat16).transpose(1, 2)]
    assert all(tma_eligible(t) for t in big)  # (plans_for takes no layout: the Gluon plans' one input check)


def test_method_is_registered_with_its_config():
    from pathlib import Path

    import yaml

    m = kernels.get_method("flash")
    assert m.ops() == {"attention": "native", "attention_qkv": "native"}
    conf = yaml.safe_load((Path(__file__).parents[1] / "conf/accel/flash.yaml").read_text())
    assert conf == {"name": "flash", "method": "flash"}


# -- full sizes on a GPU ---------------------------------------------------------------------------
GPU_SHAPES = [(16, 12, 1024, 64), (4, 12, 4096, 64), (8, 16, 2048, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_full_size_against_float64_on_two_heads(shape, causal):
    B, H, T, d = shape
    q, k, v = make_qkv(B, H, T, T, d, torch.bfloat16, layout="bthd", device="cuda")
    out = kernels.attention(q, k, v, causal=causal, method="flash")
    do = torch.randn_like(out)
    out.backward(do)
    sub = [t.detach()[:1, :2].double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*sub, causal=causal)
    ref.backward(do[:1, :2].double())
    for got, want, tol in ((out, ref, kernels.ATTN_FWD_TOL), (q.grad, sub[0].grad, kernels.ATTN_BWD_TOL),
                           (k.grad, sub[1].grad, kernels.ATTN_BWD_TOL), (v.grad, sub[2].grad, kernels.ATTN_BWD_TOL)):
        assert torch.isfinite(got).all()
        assert kernels.relative_error(got[:1, :2], want) <= tol[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("kv_heads", [12, 4], ids=["mha", "gqa"])
def test_gpu_eager_forward_backward_never_synchronizes(layout, kv_heads):
    """kernels.attention(..., method="flash") forward + backward, as a training loop calls it, issues no
    operation that makes the host wait for the device (an eager call that did would serialize the host's
    launches with the kernels: the step then costs their sum)."""
    q, k, v = make_qkv(4, 12, 1024, 1024, 64, torch.bfloat16, layout=layout, device="cuda")
    k, v = ((t[:, :kv_heads].contiguous() if layout == "bhtd" else t[:, :kv_heads]).detach().requires_grad_(True)
            for t in (k, v))
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)

    def step():
        torch.autograd.grad(kernels.attention(q, k, v, causal=True, method="flash"), (q, k, v), do)

    assert_never_synchronizes(step)


@pytest.mark.gpu
def test_gpu_opcheck_and_compile():
    q, k, v = (t.detach() for t in make_qkv(2, 4, 256, 256, 64, torch.bfloat16, layout="bthd", device="cuda"))
    torch.library.opcheck(torch.ops.softmax_harness.flash_attention_fwd.default, (q, k, v, 0.125, True))
    out, lse = torch.ops.softmax_harness.flash_attention_fwd(q, k, v, 0.125, True)
    torch.library.opcheck(torch.ops.softmax_harness.flash_attention_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.125, True))
    f = lambda q, k, v: kernels.attention(q, k, v, method="flash")  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


@pytest.mark.gpu
def test_gpu_gpt_training_step_matches_torch():
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    def step(method):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=512, context=256, n_layer=2, n_head=4, n_embd=256)).cuda()
        apply_accel(model, method, patch=["attention"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        idx = torch.randint(0, 512, (4, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        losses = []
        for _ in range(3):
            with torch.autocast("cuda", torch.bfloat16):
                _, loss = model(idx, idx.roll(-1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    ref, got = step("torch"), step("flash")
    for a, b in zip(ref, got):
        assert abs(a - b) <= 2e-2 * abs(a), (ref, got)
