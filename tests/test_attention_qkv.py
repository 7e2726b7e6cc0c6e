"""The ``attention_qkv`` op (the attention of one projection's output, before it is split): its contract
and checks, its composition from ``attention``, flash's native op (one gradient tensor, no concatenation),
the model's seam and the harness's wiring and gate.

On the CPU flash runs in Triton's interpreter with 16-wide blocks (tests/test_flash_attention.py's plans).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.registry import Method
from kernels.layouts import split_qkv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_flash = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                 reason="flash cannot run here")


def _qkv(B=2, T=19, H=2, d=16, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, 3 * H * d, generator=g).to(device=device, dtype=dtype).requires_grad_(True)


def _run(qkv, H, method, **kw):
    out = kernels.attention_qkv(qkv, H, method=method, **kw)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    out.backward(do)
    return out, qkv.grad, do


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_composed_op_is_attention_of_the_split_views(causal, scale):
    qkv = _qkv(device="cpu")
    out, grad, do = _run(qkv, 2, "torch", causal=causal, scale=scale)
    ref_in = qkv.detach().clone().requires_grad_(True)
    ref = kernels.attention(*split_qkv(ref_in, 2), causal=causal, scale=scale, method="torch")
    ref.backward(do)
    assert out.shape == (2, 2, 19, 16)
    assert torch.equal(out, ref) and torch.equal(grad, ref_in.grad)


def test_split_qkv_is_the_models_split():
    qkv = torch.arange(2 * 3 * 24, dtype=torch.float32).view(2, 3, 24)
    q, k, v = split_qkv(qkv, 2)
    assert q.shape == (2, 2, 3, 4)
    assert torch.equal(v[1, 1, 2], qkv[1, 2, 20:24]) and torch.equal(k[0, 0, 1], qkv[0, 1, 8:12])
    assert q.data_ptr() == qkv.data_ptr()  # views, no copy


def test_clear_errors():
    qkv = _qkv(device="cpu")
    with pytest.raises(ValueError, match=r"n_head, an int >= 1; got 0"):
        kernels.attention_qkv(qkv, 0)
    with pytest.raises(ValueError, match="n_head, an int"):
        kernels.attention_qkv(qkv, True)
    with pytest.raises(ValueError, match=r"positive multiple of 15"):
        kernels.attention_qkv(qkv, 5)  # 96 columns are not 3 * 5 heads of one size
    with pytest.raises(ValueError, match=r"shape \(B, T, 3 \* n_head \* d\)"):
        kernels.attention_qkv(qkv[0], 2)
    with pytest.raises(ValueError, match=r"dropout_p=1.5 is not accepted"):
        kernels.attention_qkv(qkv, 2, dropout_p=1.5)
    with pytest.raises(TypeError, match="dtype torch.float64"):
        kernels.attention_qkv(qkv.double(), 2)


def test_empty_batch_gives_zeros_connected_to_the_input():
    qkv = torch.zeros(0, 5, 48, requires_grad=True)
    out = kernels.attention_qkv(qkv, 2)
    assert out.shape == (0, 2, 5, 8)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape


def test_registry_composes_it_down_to_the_softmax():
    name = "_qkv_chain_test"
    kernels.register(Method(name=name, summary="softmax only",
                            softmax=lambda s, scale, causal: torch.softmax(s * scale, -1)))
    try:
        m = kernels.get_method(name)
        assert m.provides("attention_qkv") == "composed" and "attention_qkv" not in m.ops()  # (a variant: unlisted)
        qkv = _qkv(T=6, device="cpu")
        got = kernels.attention_qkv(qkv, 2, causal=False, method=name)
        want = kernels.attention(*split_qkv(qkv, 2), causal=False, method="torch")
        assert torch.allclose(got, want, atol=1e-6)
    finally:
        kernels.unregister(name)
    assert kernels.get_method("torch").provides("attention_qkv") == "composed"


@needs_flash
def test_flash_provides_it_natively():
    assert kernels.get_method("flash").provides("attention_qkv") == "native"


@needs_flash
@pytest.mark.parametrize("dtype,T", [(torch.float32, 19), (torch.bfloat16, 33), (torch.float16, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_native_equals_its_composed_path_and_float64(dtype, T, causal):
    from tests.test_flash_attention import SMALL

    with plans.override(*SMALL):
        out, grad, do = _run(_qkv(T=T, dtype=dtype), 2, "flash", causal=causal)
        qkv = _qkv(T=T, dtype=dtype)
        composed = kernels.attention(*split_qkv(qkv, 2), causal=causal, method="flash")
        composed.backward(do)
    assert grad.is_contiguous() and grad.shape == qkv.shape and grad.dtype == dtype
    assert torch.equal(out, composed) and torch.equal(grad, qkv.grad)  # same kernels, gradients in place
    ref_in = qkv.detach().double().requires_grad_(True)
    ref = kernels.reference_attention(*split_qkv(ref_in, 2), causal=causal)
    ref.backward(do.double())
    assert kernels.relative_error(out, ref) <= kernels.ATTN_FWD_TOL[dtype]
    assert kernels.relative_error(grad, ref_in.grad) <= kernels.ATTN_BWD_TOL[dtype]


def test_a_method_with_attention_qkv_alone_is_refused():
    with pytest.raises(ValueError, match="implements attention_qkv but not attention"):
        Method(name="_qkv_only", summary="x", attention_qkv=lambda qkv, h, s, c, p: qkv)


@needs_flash
def test_flash_second_order_gradients_are_refused_not_dropped():
    from tests.test_flash_attention import SMALL

    for op, args in ((kernels.attention_qkv, lambda x: (x, 2)), (kernels.attention, lambda x: split_qkv(x, 2))):
        qkv = _qkv(B=1, T=5)
        with plans.override(*SMALL):
            out = op(*args(qkv), method="flash")
            do = torch.ones_like(out, requires_grad=True)  # (a gradient that is itself differentiated)
            grad, = torch.autograd.grad(out, qkv, do, create_graph=True)
            with pytest.raises(RuntimeError, match="once_differentiable"):
                grad.sum().backward()


@needs_flash
def test_flash_qkv_refuses_dropout():
    with pytest.raises(ValueError, match="no dropout"):
        kernels.attention_qkv(_qkv(), 2, dropout_p=0.1, method="flash")


@pytest.mark.slow
@needs_flash
def test_flash_qkv_opcheck_and_fullgraph_compile():
    from tests.test_flash_attention import SMALL

    qkv = _qkv(B=1, T=20, dtype=torch.float16).detach()
    ops = torch.ops.softmax_harness
    with plans.override(*SMALL):
        torch.library.opcheck(ops.flash_attention_qkv_fwd.default, (qkv, 2, 0.25, True))
        out, lse = ops.flash_attention_qkv_fwd(qkv, 2, 0.25, True)
        torch.library.opcheck(ops.flash_attention_qkv_bwd.default,
                              (torch.randn_like(out), qkv, out, lse, 2, 0.25, True))

        def f(x):
            return kernels.attention_qkv(x * 1.5, 2, method="flash").float().square().sum()

        x = qkv.to(torch.bfloat16).requires_grad_(True)
        eager = f(x)
        grad, = torch.autograd.grad(eager, x)
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
        cgrad, = torch.autograd.grad(compiled, x)
    assert torch.equal(eager, compiled) and torch.equal(grad, cgrad)


@needs_flash
def test_model_seam_and_accel_wiring():
    """apply_accel gives the model flash's attention_qkv (bound, and gated by the gate); the model's loss and
    gradients are those of the split path bit for bit."""
    from harness.accel import apply_accel, patched_ops
    from harness.gate import check_attention_qkv
    from models import GPT, GPTConfig, attention_cores, set_attention
    from tests.test_flash_attention import SMALL

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context=24, n_layer=2, n_head=2, n_embd=32)).to(DEVICE)
    applied = apply_accel(model, "flash", patch=["attention"])
    assert applied.attention_qkv and applied.as_dict()["attention_qkv"]
    assert "attention=native (qkv)" in applied.describe()
    assert all(a.core.qkv_fn is kernels.bind("flash", "attention_qkv") for a in attention_cores(model))
    assert patched_ops(applied)["attention_qkv"] is kernels.bind("flash", "attention_qkv")
    idx = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    runs = []
    with plans.override(*SMALL):
        for qkv_fn in (kernels.bind("flash", "attention_qkv"), None):
            set_attention(model, kernels.bind("flash", "attention"), qkv_fn)
            model.zero_grad(set_to_none=True)
            _, loss = model(idx, idx.roll(-1, dims=1))
            loss.backward()
            runs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        gate = check_attention_qkv("flash", 2, 21, 16, torch.float32, DEVICE)
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert gate.passed and gate.op == "attention_qkv" and gate.shape == (1, 21, 96), gate
    plain = apply_accel(GPT(GPTConfig(vocab_size=64, context=24, n_layer=1, n_head=2, n_embd=32)), "torch")
    assert not plain.attention_qkv and "attention_qkv" not in patched_ops(plain)
    split = GPT(GPTConfig(vocab_size=64, context=24, n_layer=1, n_head=2, n_embd=32))
    assert not apply_accel(split, "flash", patch=["attention"], qkv=False).attention_qkv  # accel.qkv=false
    assert all(a.core.qkv_fn is None for a in attention_cores(split))


@needs_flash
@pytest.mark.parametrize("H,d", [(3, 24), (1, 7)])
def test_flash_native_with_other_head_dims_and_a_strided_qkv(H, d):
    from tests.test_flash_attention import SMALL

    wide = _qkv(B=2, T=13, H=H, d=2 * d).detach()  # (2, 13, 6 H d): every other column is qkv's
    qkv = wide[..., ::2].requires_grad_(True)
    with plans.override(*SMALL):
        out, grad, do = _run(qkv, H, "flash")
    ref_in = qkv.detach().double().requires_grad_(True)
    ref = kernels.reference_attention(*split_qkv(ref_in, H), causal=True)
    ref.backward(do.double())
    assert kernels.relative_error(out, ref) <= kernels.ATTN_FWD_TOL[torch.float32]
    assert kernels.relative_error(grad, ref_in.grad) <= kernels.ATTN_BWD_TOL[torch.float32]


def test_a_core_without_attend_qkv_still_takes_q_k_v():
    """swap_attention_cores takes any module with forward(q, k, v): the block splits for it."""
    from models import GPT, GPTConfig, swap_attention_cores

    class Core(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context=16, n_layer=1, n_head=2, n_embd=32))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    _, ref = model(idx, idx.roll(-1, dims=1))
    swap_attention_cores(model, Core)
    _, loss = model(idx, idx.roll(-1, dims=1))
    assert torch.allclose(loss, ref, rtol=1e-5)


def test_gate_checks_the_runs_width_and_the_unchecked_heads():
    """Every head is computed at the run's width; the checked ones against float64, the others must get no
    gradient from a zero output gradient."""
    from harness.gate import check_attention_qkv

    ok = check_attention_qkv("torch", 3, 9, 8, torch.float32, "cpu", checked=1)
    assert ok.passed and ok.shape == (1, 9, 72), ok
    name = "_qkv_leaky_test"

    def leaky(qkv, h, s, c, p):  # right values, and a gradient leaking into every column
        out = kernels.attention(*split_qkv(qkv, h), scale=s, causal=c, method="torch")
        leak = (qkv * 1e-3).sum()
        return out + (leak - leak.detach())  # (adds 0, and 1e-3 * sum(dout) to every gradient column)

    kernels.register(Method(name=name, summary="leaky", attention=lambda q, k, v, s, c, p: q, attention_qkv=leaky))
    try:
        res = check_attention_qkv(name, 3, 9, 8, torch.float32, "cpu", checked=1)
    finally:
        kernels.unregister(name)
    assert not res.passed and "nonzero gradient on heads" in res.reason, res

    def wrong_last_head(qkv, h, s, c, p):
        out = kernels.attention(*split_qkv(qkv, h), scale=s, causal=c, method="torch")
        return torch.cat([out[:, :-1], out[:, -1:] * 1.01], dim=1)

    kernels.register(Method(name=name, summary="x", attention=lambda q, k, v, s, c, p: q,
                            attention_qkv=wrong_last_head))
    try:
        res = check_attention_qkv(name, 3, 9, 8, torch.float32, "cpu", checked=1)  # (one head checked: the last)
    finally:
        kernels.unregister(name)
    assert not res.passed and "forward error" in res.reason, res


def test_gate_fails_a_wrong_attention_qkv():
    from harness.gate import check_attention_qkv

    name = "_qkv_wrong_test"
    kernels.register(Method(name=name, summary="wrong", attention=lambda q, k, v, s, c, p: torch.zeros_like(q),
                            attention_qkv=lambda qkv, h, s, c, p: kernels.attention(
                                *split_qkv(qkv, h), scale=s, causal=c, method="torch") * 1.01))
    try:
        res = check_attention_qkv(name, 2, 9, 8, torch.float32, "cpu")
    finally:
        kernels.unregister(name)
    assert not res.passed and "forward error" in res.reason


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("shape", [(16, 12, 1024, 64), (4, 12, 4096, 64), (2, 16, 2048, 128), (1, 4, 1000, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_flash_native_equals_composed_at_full_size(shape, deterministic):
    """The table's plans (the Triton backward at T <= 1024, the Gluon ones beyond, adding dq by TMA at d = 64;
    the prepared launches on the second call), the output gradient in the model's (B, T, H, d) layout: the
    native op's output and the q, k and v parts of its gradient are the composed path's bit for bit, except
    dq where the plan adds it by TMA reductions (their fp32 order varies from run to run, so the bf16 result
    may differ by a rounding step; under torch.use_deterministic_algorithms the dq pass runs: bit for bit)."""
    B, H, T, d = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    do = torch.randn(B, T, H, d, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    results = []
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        for native in (True, False, True):
            qkv = _qkv(B, T, H, d, torch.bfloat16, device="cuda")
            if native:
                out = kernels.attention_qkv(qkv, H, method="flash")
            else:
                out = kernels.attention(*split_qkv(qkv, H), method="flash")
            out.backward(do)
            results.append((out.detach(), split_qkv(qkv.grad, H)))
    finally:
        torch.use_deterministic_algorithms(before)
    # dq added into fp32 sums by the dk/dv programs (dq_mode "tma_add" or "atomic"): no fixed order
    unordered_dq = not deterministic and plans.plans_for(d, d, torch.bfloat16, True, T, T)[1].dq_mode != "pass"
    for out, parts in results[1:]:
        assert torch.equal(out, results[0][0])
        for name, got, want in zip("qkv", parts, results[0][1]):
            if name == "q" and unordered_dq:
                gap = (got.float() - want.float()).abs()
                assert (gap <= want.float().abs() * 2.0 ** -7 + 1e-6 * want.float().abs().max()).all(), name
            else:
                assert torch.equal(got, want), name
    assert all(torch.isfinite(p).all() for p in results[0][1])


@pytest.mark.gpu
def test_gpu_gate_at_a_long_runs_width():
    from harness.gate import check_attention_qkv

    res = check_attention_qkv("flash", 12, 4096, 64, torch.bfloat16, "cuda", checked=1)
    assert res.passed and res.shape == (1, 4096, 2304), res


@pytest.mark.slow
@needs_flash
def test_breakdown_brackets_the_qkv_op_the_run_calls():
    from harness.accel import apply_accel
    from harness.breakdown import measure
    from models import GPT, GPTConfig, attention_cores
    from tests.test_flash_attention import SMALL

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context=24, n_layer=2, n_head=2, n_embd=32)).to(DEVICE)
    applied = apply_accel(model, "flash", patch=["attention"])
    calls = []
    bound = kernels.bind("flash", "attention_qkv")

    def counted(*args):
        calls.append(args[0].shape)
        return bound(*args)

    for a in attention_cores(model):
        a.core.qkv_fn = counted
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with plans.override(*SMALL):
        b = measure(model, [(idx, idx.roll(-1, dims=1))], applied, steps=2, warmup=1)
    assert len(calls) == 3 * 2 and calls[0] == (2, 16, 96)  # every step, every layer, on the unsplit projection
    att = b.parts["attention"]
    assert att.name == "fused attention" and att.fwd_ms > 0 and att.bwd_ms > 0
    assert all(a.core.qkv_fn is counted for a in attention_cores(model))  # restored


@needs_flash
def test_run_gate_checks_the_attention_op_the_run_calls():
    from harness import gate
    from harness.accel import Applied
    from tests.test_flash_attention import SMALL

    shapes = gate.RunShapes(heads=2, seq_len=16, head_dim=16, vocab=64, n_embd=32, tokens=64,
                            dtype=torch.float32, device=DEVICE)
    with plans.override(*SMALL):
        packed = gate.run_gate(Applied("flash", attention="native", attention_qkv=True), shapes)
        split = gate.run_gate(Applied("flash", attention="native"), shapes)
    assert [c["op"] for c in packed["checks"]] == ["attention_qkv"] and packed["shape"] == (1, 16, 96)
    assert [c["op"] for c in split["checks"]] == ["attention"]


def test_breakdown_brackets_a_grouped_qkv_op_with_its_kv_heads():
    """The breakdown's marks pass n_kv_head on: a Llama-family model with Hkv < H calls the qkv op with it
    (a flash_linear study row on qwen25_05b once went unprofiled for want of it)."""
    from harness.accel import apply_accel
    from harness.breakdown import measure
    from models.llama import Llama, LlamaConfig

    calls = []

    def grouped_qkv(qkv, n_head, scale, causal, dropout_p, n_kv_head=None):
        calls.append((tuple(qkv.shape), n_head, n_kv_head))
        return kernels.attention_qkv(qkv, n_head, n_kv_head=n_kv_head, scale=scale, causal=causal, method="torch")

    fake = Method(name="_test_grouped_qkv", summary="test", attention=kernels.bind("torch", "attention"),
                  attention_qkv=grouped_qkv)
    kernels.register(fake)
    try:
        torch.manual_seed(0)
        model = Llama(LlamaConfig(vocab_size=64, context=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                                  mlp_hidden=48))
        applied = apply_accel(model, fake.name, patch=["attention"])
        assert applied.attention_qkv
        idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
        b = measure(model, [(idx, idx.roll(-1, dims=1))], applied, steps=2, warmup=1)
    finally:
        kernels.unregister(fake.name)
    assert calls and set(calls) == {((2, 16, (4 + 2 * 2) * 8), 4, 2)}  # every call with its 2 kv heads
    att = b.parts["attention"]
    assert att.fwd_ms > 0 and att.bwd_ms > 0
