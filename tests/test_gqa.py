"""Grouped-query attention in the contract (issue 54): k and v with Hkv heads dividing q's H, query head
h on kv head h // (H / Hkv), through every method that runs here, against float64; the refusals; the
grouped projection of attention_qkv; the gate's grouped cases; compiled; the Llama model trained with
grouped heads through the harness. (flash's own grouped kernels are tested with flash.)"""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from harness import gate
from kernels.compose import attention_from_softmax
from kernels.layouts import expand_kv, split_qkv
from kernels.methods.sdpa import GQA_BACKENDS, check_gqa_backend
from kernels.reference import ATTN_BWD_TOL, ATTN_FWD_TOL
from tests.test_llama import QUICK, compose_cfg, run_training

H = 4
#: every method whose attention runs here, but flash (whose grouped kernels are its own engineer's)
METHODS = [m for m in kernels.runnable_methods(op="attention") if m != "flash"]
SLOW = {"compile"}  # a compile per signature: 10 s and more on two CPU cores
#: the dtypes each method is checked in here (triton: fp32, its interpreter being slow)
DTYPES = {m: (torch.float32, torch.float16, torch.bfloat16) for m in ("naive", "torch", "sdpa")}


def params(methods):
    return [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in methods]


def grouped(B, Hkv, tq, tk, d, dv, dtype=torch.float32, seed=0):
    """q (B, H, Tq, d), k (B, Hkv, Tk, d), v (B, Hkv, Tk, dv), each a strided view (T-major storage, as
    a model's projection split into heads), requiring grad."""
    g = torch.Generator().manual_seed(seed)

    def view(heads, t, width):
        base = torch.randn(B, t, heads, width + 3, generator=g).to(dtype)[..., :width]  # padded rows
        return base.transpose(1, 2).requires_grad_(True)

    return view(H, tq, d), view(Hkv, tk, d), view(Hkv, tk, dv)


def against_float64(method, q, k, v, causal=True, **options):
    """Relative errors of the output and of q, k, v's gradients against the float64 reference."""
    out = kernels.attention(q, k, v, causal=causal, method=method, **options)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(dout)
    ref_in = [t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*ref_in, causal=causal)
    ref.backward(dout.to(torch.float64))
    assert out.shape == (q.shape[0], H, q.shape[2], v.shape[-1]) and out.dtype == q.dtype
    assert k.grad.shape == k.shape and v.grad.shape == v.shape  # summed over the group, not expanded
    return [kernels.relative_error(a, b) for a, b in zip([out, q.grad, k.grad, v.grad], [ref] + [t.grad for t in ref_in])]


@pytest.mark.parametrize("method", params(METHODS))
@pytest.mark.parametrize("Hkv", [1, 2, H])
@pytest.mark.parametrize("tq,tk,causal", [(7, 7, True), (5, 9, True), (9, 6, True), (5, 9, False)])
def test_every_method_against_float64(method, Hkv, tq, tk, causal):
    for dtype in DTYPES.get(method, (torch.float32,)):
        errs = against_float64(method, *grouped(2, Hkv, tq, tk, 8, 6, dtype, seed=Hkv), causal=causal)
        assert errs[0] <= ATTN_FWD_TOL[dtype] and max(errs[1:]) <= ATTN_BWD_TOL[dtype], (dtype, errs)


def test_query_head_h_reads_kv_head_h_over_the_group():
    q, k, v = (t.detach() for t in grouped(1, 2, 5, 5, 8, 8))
    out = kernels.attention(q, k, v, method="torch")
    for h in range(H):  # each head on its own, as plain attention on its kv head
        one = kernels.attention(q[:, h:h + 1], k[:, h // 2:h // 2 + 1], v[:, h // 2:h // 2 + 1], method="torch")
        torch.testing.assert_close(out[:, h:h + 1], one)


def test_the_composed_attention_hands_the_softmax_the_heads_layout_and_copies_no_kv():
    seen = []

    def softmax(scores, scale, causal):
        seen.append(tuple(scores.shape))
        return kernels.bind("torch", "softmax")(scores, scale, causal)

    q, k, v = (torch.randn(2, s, 5, 8) for s in (H, 2, 2))
    attention = attention_from_softmax(softmax)
    out = attention(q, k, v, 0.3, True, 0.0)
    assert seen == [(2, H, 5, 5)]  # (B, H, Tq, Tk): the softmax's usual layout and causal mask
    torch.testing.assert_close(out, kernels.reference_attention(q, k, v, scale=0.3).float())
    # the grouped matmul reads k and v as they are: an expanded copy would not share their storage
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.untyped_storage().data_ptr()) or t,
                                                  lambda t: t):
        attention(*(t.requires_grad_(True) for t in (q, k, v)), 0.3, True, 0.0)
    saved = set(seen[1:])
    assert k.untyped_storage().data_ptr() in saved and v.untyped_storage().data_ptr() in saved


@pytest.mark.parametrize("shapes,words", [
    (((1, 4, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)), "q (1, 4, 5, 8), k (1, 3, 5, 8)"),  # H % Hkv != 0
    (((1, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)), "k (2, 2, 5, 8)"),  # batch
    (((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 6, 8)), "v (1, 2, 6, 8)"),  # Tk of k and v
    (((1, 4, 5, 8), (1, 2, 5, 4), (1, 2, 5, 8)), "k (1, 2, 5, 4)"),  # d
    (((1, 4, 5, 8), (1, 2, 5, 8), (1, 1, 5, 8)), "v (1, 1, 5, 8)"),  # k and v heads
    (((1, 2, 5, 8), (1, 4, 5, 8), (1, 4, 5, 8)), "k (1, 4, 5, 8)"),  # more kv heads than q heads
])
def test_bad_shapes_are_refused_naming_them(shapes, words):
    q, k, v = (torch.randn(s) for s in shapes)
    for method in ("torch", "sdpa"):
        with pytest.raises(ValueError, match="H a multiple of Hkv") as e:
            kernels.attention(q, k, v, method=method)
        assert words in str(e.value)


def test_attention_qkv_takes_the_grouped_projection():
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 7, (H + 2 * 2) * 8, generator=g, requires_grad=True)
    q, k, v = split_qkv(qkv, H, 2)
    assert (q.shape, k.shape, v.shape) == ((2, H, 7, 8), (2, 2, 7, 8), (2, 2, 7, 8))
    assert q.data_ptr() == qkv.data_ptr() and v.stride() == k.stride() == q.stride()  # views, no copy
    out = kernels.attention_qkv(qkv, H, n_kv_head=2, method="torch")
    out.backward(torch.ones_like(out))
    ref_in = qkv.detach().double().requires_grad_(True)
    ref = kernels.reference_attention(*split_qkv(ref_in, H, 2))
    ref.backward(torch.ones_like(ref))
    assert kernels.relative_error(out, ref) < 1e-5 and kernels.relative_error(qkv.grad, ref_in.grad) < 1e-4
    # n_kv_head == n_head is today's call and layout
    full = torch.randn(2, 7, 3 * H * 8, generator=g)
    torch.testing.assert_close(kernels.attention_qkv(full, H, n_kv_head=H), kernels.attention_qkv(full, H))


@pytest.mark.parametrize("n_kv_head,words", [
    (3, "n_kv_head dividing n_head; got n_head=4, n_kv_head=3"),
    (0, "n_kv_head, an int >= 1; got 0"),
    (1, "positive multiple of 6"),  # 64 columns are not (4 + 2) heads of one size
])
def test_attention_qkv_refuses_a_bad_grouping(n_kv_head, words):
    with pytest.raises(ValueError, match="attention_qkv") as e:
        kernels.attention_qkv(torch.randn(2, 5, 64), H, n_kv_head=n_kv_head)
    assert words in str(e.value)


def test_a_native_attention_qkv_gets_n_kv_head_only_where_grouped():
    calls = []

    def native(qkv, n_head, scale, causal, dropout_p, *kv):
        calls.append(kv)
        return kernels.reference_attention(*split_qkv(qkv, n_head, *kv), scale=scale, causal=causal).to(qkv.dtype)

    fn = kernels.ops.get("attention_qkv").wrap(native, None)
    fn(torch.randn(1, 5, 64), 4, None, True, 0.0, 2)
    fn(torch.randn(1, 5, 96), 4)
    assert calls == [(2,), ()]  # a method written before grouped heads keeps its five arguments


def test_sdpa_names_the_backends_that_take_grouped_heads():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    for backend in ("efficient", "cudnn"):
        with pytest.raises(ValueError, match=f"backend='{backend}' does not take grouped-query") as e:
            check_gqa_backend(q, k, backend)
        assert "flash, math" in str(e.value) and "(1, 4, 5, 8)" in str(e.value)
    assert all(check_gqa_backend(q, k, b) for b in GQA_BACKENDS)
    assert not check_gqa_backend(q, q, "efficient")  # full heads: every backend


def test_sdpa_math_backend_takes_grouped_heads():
    errs = against_float64("sdpa", *grouped(1, 2, 6, 6, 8, 8), backend="math")
    assert errs[0] < 1e-5 and max(errs[1:]) < 1e-4


@pytest.mark.parametrize("method", ["naive", "sdpa"])
def test_the_gate_checks_the_runs_grouping(method):
    shapes = gate.RunShapes(heads=H, seq_len=9, head_dim=8, vocab=16, n_embd=32, tokens=9, dtype=torch.float32,
                            device="cpu", kv_heads=2)
    case = kernels.ops.get("attention").gate_case(shapes, 3, 0)  # 3 heads: rounded up to whole groups
    assert [tuple(t.shape) for t in case.args[:3]] == [(1, 4, 9, 8), (1, 2, 9, 8), (1, 2, 9, 8)]
    assert gate.check_op(method, "attention", shapes).passed
    for checked in (H, 2):  # every head, or the first and the last
        res = gate.check_attention_qkv(method, H, 9, 8, torch.float32, "cpu", checked=checked, kv_heads=2)
        assert res.passed and res.shape == (1, 9, (H + 4) * 8), res.reason
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=4"):
        gate.RunShapes(heads=4, seq_len=9, head_dim=8, vocab=16, n_embd=32, tokens=9, dtype=torch.float32,
                       device="cpu", kv_heads=3)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["torch", "sdpa"])
def test_a_fullgraph_compile_of_grouped_attention(method):
    q, k, v = (t.detach() for t in grouped(1, 2, 7, 7, 8, 8))
    f = torch.compile(lambda q, k, v: kernels.attention(q, k, v, method=method), fullgraph=True)
    torch.testing.assert_close(f(q, k, v), kernels.attention(q, k, v, method=method), rtol=1e-5, atol=1e-5)


def test_expand_kv_is_repeat_kv():
    x = torch.randn(2, 3, 4, 5)
    y = expand_kv(x, 2)
    assert y.shape == (2, 6, 4, 5) and all(torch.equal(y[:, h], x[:, h // 2]) for h in range(6))
    assert expand_kv(x, 1) is x


@pytest.mark.slow  # a 3-step run through the harness: 8-10 s on two CPU cores
@pytest.mark.parametrize("method", ["torch", "sdpa"])
def test_llama_tiny_with_grouped_heads_trains_through_the_harness(tmp_path, method):
    cfg = compose_cfg(*QUICK, f"accel={method}")
    assert cfg.model.n_kv_head < cfg.model.n_head
    res = run_training(cfg, tmp_path)
    assert res["status"] == "completed" and res["patched"]["attention"] in ("native", "composed")
    assert res["gate"]["checked"] and all(math.isfinite(x) for x in res["loss_curve"])
