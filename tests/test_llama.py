"""The Llama-family model: forward and backward, grouped-query attention against float64, RoPE, tied and
untied heads, q/k/v biases, FLOPs, its configs and their checks, and training it through the harness
with every method that runs here."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from harness.accel import apply_accel
from harness.build import build_model
from harness.config import ConfigError, validate
from harness.task import make_optimizer
from harness.training import run_training
from models import Llama, LlamaConfig, attention_cores, eager_attention, eager_gqa_attention, set_attention
from models.llama import apply_rope, rope_tables
from tests.test_train import compose_cfg

CFG = LlamaConfig(vocab_size=97, context=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, mlp_hidden=96)
#: a quick harness run of llama_tiny: a small corpus (its BPE trains in a second), short sequences
QUICK = ["model=llama_tiny", "trainer=cpu", "logger=none", "trainer.max_steps=3", "trainer.warmup_steps=1",
         "trainer.window=1", "trainer.val_every=0", "trainer.val_batches=1", "data.max_bytes=300000",
         "data.seq_len=16", "data.batch_size=2"]


def config(**changes) -> LlamaConfig:
    return LlamaConfig(**{**CFG.__dict__, **changes})


def loss_of(model: Llama, idx: torch.Tensor) -> torch.Tensor:
    return model(idx, idx.roll(-1, dims=1))[1]


def test_forward_and_backward_on_the_cpu():
    torch.manual_seed(0)
    model = Llama(CFG)
    idx = torch.randint(0, CFG.vocab_size, (3, 19))
    logits, _ = model(idx)
    assert logits.shape == (3, 19, CFG.vocab_size)
    loss = loss_of(model, idx)
    assert abs(loss.item() - math.log(CFG.vocab_size)) < 0.5  # small init: about uniform
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="exceeds the model's context 24"):
        model(torch.zeros(1, 25, dtype=torch.long))


def reference_gqa(q, k, v, scale):
    """Causal attention head by head, query head h on kv head h // (H / Hkv), explicitly."""
    H, Hkv, T = q.shape[1], k.shape[1], q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for h in range(H):
        kv = h // (H // Hkv)
        s = (q[:, h] @ k[:, kv].transpose(-1, -2) * scale).masked_fill(mask, float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v[:, kv])
    return torch.stack(heads, dim=1)


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_grouped_query_core_equals_the_head_by_head_reference_in_float64(n_kv_head):
    g = torch.Generator().manual_seed(n_kv_head)
    B, H, T, d = 2, 4, 7, 8
    q = torch.randn(B, H, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, n_kv_head, T, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    dy = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    out = eager_gqa_attention(q, k, v, d ** -0.5, True, 0.0)
    ref = reference_gqa(q, k, v, d ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(out, (q, k, v), dy)
    want = torch.autograd.grad(ref, (q, k, v), dy)  # k and v's: summed over their query group
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_attention_seam_gets_k_and_v_unexpanded():
    torch.manual_seed(0)
    model = Llama(CFG)
    idx = torch.randint(0, CFG.vocab_size, (2, 11))
    ref = loss_of(model, idx)
    shapes = []

    def recording(q, k, v, scale, causal, dropout_p):
        shapes.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), scale, causal))
        return eager_gqa_attention(q, k, v, scale, causal, dropout_p)

    undo = set_attention(model, recording)
    assert loss_of(model, idx).item() == ref.item()
    assert shapes == [((2, 4, 11, 16), (2, 2, 11, 16), (2, 2, 11, 16), 0.25, True)] * CFG.n_layer
    undo()
    assert all(a.core.attention_fn is eager_gqa_attention for a in attention_cores(model))


def test_qkv_fn_takes_the_rotated_projection_with_n_kv_head_where_grouped():
    from kernels.contract import split_qkv

    torch.manual_seed(0)
    calls = []

    def qkv_fn(qkv, n_head, scale, causal, dropout_p, *kv):
        calls.append((tuple(qkv.shape), n_head, *kv))
        return eager_gqa_attention(*split_qkv(qkv, n_head, *kv), scale, causal, dropout_p)

    idx = torch.randint(0, CFG.vocab_size, (2, 9))
    for kv in (2, 4):  # grouped: n_kv_head as a sixth argument; full heads: today's five
        calls.clear()
        model = Llama(config(n_kv_head=kv))
        split = loss_of(model, idx)  # split by the model itself
        set_attention(model, eager_gqa_attention, qkv_fn)
        torch.testing.assert_close(loss_of(model, idx), split, rtol=1e-6, atol=1e-6)
        assert calls == [((2, 9, (4 + 2 * kv) * 16), 4, *([kv] if kv < 4 else []))] * CFG.n_layer


def test_rope_turns_q_and_k_so_that_their_product_depends_on_the_distance_only():
    d, T = 16, 40
    cos, sin = rope_tables(d, T, theta=10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, d, generator=g, dtype=torch.float64)
    rq = apply_rope(q.expand(1, T, 1, d), cos, sin)[0, :, 0]  # q at every position, (T, d)
    rk = apply_rope(k.expand(1, T, 1, d), cos, sin)[0, :, 0]
    torch.testing.assert_close(rq[0], q)  # position 0: no turn
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(T))  # a rotation
    dots = rq @ rk.T  # (T, T): q at m, k at n
    for shift in (0, 3, -5, 17):
        diag = torch.diagonal(dots, offset=shift)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(torch.diagonal(dots, 1)[0], torch.diagonal(dots, 2)[0])


def test_tied_and_untied_heads():
    torch.manual_seed(0)
    tied, untied = Llama(CFG), Llama(config(tied=False))
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    n = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n + CFG.vocab_size * CFG.n_embd
    assert untied.matmul_params() == tied.matmul_params()  # the head is a matmul, the untied embedding a lookup
    loss_of(untied, torch.randint(0, CFG.vocab_size, (2, 8))).backward()
    assert untied.wte.weight.grad.abs().sum() > 0 and untied.lm_head.weight.grad.abs().sum() > 0


def test_qkv_bias_only_when_asked():
    assert [n for n, _ in Llama(CFG).named_parameters() if n.endswith("bias")] == []
    model = Llama(config(qkv_bias=True))
    biases = {n: p for n, p in model.named_parameters() if n.endswith("bias")}
    assert sorted(biases) == [f"blocks.{i}.attn.qkv_proj.bias" for i in range(CFG.n_layer)]
    assert all(p.shape == ((4 + 2 * 2) * 16,) and not p.any() for p in biases.values())


def test_weight_decay_and_init_follow_the_gpt():
    torch.manual_seed(0)
    model = Llama(config(qkv_bias=True))
    decay, no_decay = make_optimizer(model, 1e-3, 0.1, (0.9, 0.95), fused=False).param_groups
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(no_decay["params"]) == 2 * CFG.n_layer + 1 + CFG.n_layer  # two norms a block, the final, biases
    assert all((p == 1).all() for n, p in model.named_parameters() if "norm" in n)


def test_flops_per_token_by_hand():
    model = Llama(CFG)  # 2 layers, C 64, 4 heads of 16 sharing 2 kv heads, SwiGLU 96, vocabulary 97, tied
    qkv = 64 * (4 + 2 * 2) * 16  # 8192: the k and v projections are half the q's
    out = 4 * 16 * 64  # 4096
    mlp = 3 * 64 * 96  # 18432: gate, up, down
    head = 97 * 64  # 6208, the tied embedding counted once
    assert model.matmul_params() == 2 * (qkv + out + mlp) + head == 67648
    assert model.flops_per_token(17) == 6 * 67648 + 12 * 2 * (4 * 16) * 17 == 432000


@pytest.mark.parametrize("overrides,words", [
    (["model.n_kv_head=3"], ["model.n_kv_head=3", "a divisor of model.n_head (4)"]),
    (["model.n_embd=66"], ["model.n_embd=66", "a multiple of model.n_head (4)"]),
    (["model.n_embd=72", "model.n_head=8", "model.n_kv_head=8"], ["model.n_embd=72", "even head dimension", "9"]),
    (["model.bias=true", "accel.patch=[loss]"], ["model.bias=True", "model.qkv_bias"]),
    (["model.mlp_hidden=null", "accel.patch=[loss]"], ["model.mlp_hidden=None", "SwiGLU"]),
    (["model.family=bert"], ["model.family='bert'", "gpt, llama"]),
])
def test_bad_llama_combinations_are_refused_naming_the_values(overrides, words):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("model=llama_tiny", *overrides))
    for w in words:
        assert w in str(e.value)


def test_grouped_kv_heads_are_accepted_with_the_attention_patched():
    cfg = compose_cfg("model=llama_tiny")
    assert cfg.model.n_kv_head < cfg.model.n_head and "attention" in cfg.accel.patch
    validate(cfg)  # every method's attention takes grouped k and v


def test_a_gpt_refuses_the_llama_keys():
    with pytest.raises(ConfigError, match=r"model.n_kv_head=2 .*model.family=gpt"):
        validate(compose_cfg("model=tiny", "model.n_kv_head=2"))
    with pytest.raises(ConfigError, match="model.qkv_bias=True"):
        validate(compose_cfg("model=tiny", "model.qkv_bias=true"))
    validate(compose_cfg("model=tiny"))


def test_a_bad_combination_exits_2_before_any_work(capsys):
    from harness.cli import precheck_overrides
    from harness.config import CONF_DIR
    from harness.train import validate_with_data

    with pytest.raises(SystemExit) as e:
        precheck_overrides(["model=llama_tiny", "model.n_kv_head=3"], CONF_DIR, "config", validate=validate_with_data)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "model.n_kv_head=3" in err


@pytest.mark.parametrize("name,params,kv,tokens", [
    ("smollm2_135m", 134_515_008, 3, 32768),
    ("qwen25_05b", 494_032_768, 2, 16384),
    ("llama32_1b", 1_235_814_400, 8, 16384),
])
def test_the_configs_have_the_published_shapes(name, params, kv, tokens):
    cfg = compose_cfg(f"model={name}", "accel.patch=[loss]")
    validate(cfg)
    assert cfg.data.tokenizer == "bpe" and cfg.data.vocab_size == cfg.model.vocab_size
    assert cfg.data.batch_size * cfg.model.context == tokens
    with torch.device("meta"):  # the shapes without the memory or the init
        model = build_model(cfg)
    assert isinstance(model, Llama) and model.config.n_kv_head == kv
    assert sum(p.numel() for p in model.parameters()) == params  # the published parameter counts
    assert model.config.tied and model.config.qkv_bias == (name == "qwen25_05b")
    assert model.config.norm_eps == (1e-6 if name == "qwen25_05b" else 1e-5)


ATTENTION_METHODS = [m for m in kernels.runnable_methods(op="attention") if not kernels.get_method(m).peer]
#: a compile per shape, or flash's kernels in Triton's interpreter: 20 s and more a run on two CPU cores
SLOW_HERE = {"compile", "flash"} if not torch.cuda.is_available() else {"compile"}


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m == "compile" else m
                                    for m in ATTENTION_METHODS])
def test_every_method_gives_the_full_kv_head_model_torchs_loss_and_gradients(method):
    torch.manual_seed(0)
    model = Llama(config(n_kv_head=4, qkv_bias=True))
    idx = torch.randint(0, CFG.vocab_size, (2, 13))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, idx)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    apply_accel(model, "torch")
    ref_loss, ref_grads = loss_and_grads()
    applied = apply_accel(model, method)
    assert applied.attention in ("native", "composed")
    loss, grads = loss_and_grads()
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    for name, g in grads.items():
        assert (g - ref_grads[name]).norm() <= 1e-4 * ref_grads[name].norm(), name


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_HERE else m
                                    for m in ATTENTION_METHODS])
def test_every_method_here_trains_llama_tiny_with_full_kv_heads(tmp_path, method):
    res = run_training(compose_cfg(*QUICK, f"accel={method}", "model.n_kv_head=4"), tmp_path)
    assert res["status"] == "completed" and res["patched"]["attention"] in ("native", "composed")
    assert res["gate"]["checked"] and all(math.isfinite(x) for x in res["loss_curve"])
    if kernels.get_method(method).provides("attention_qkv") == "native":
        assert res["patched"]["attention_qkv"]


def test_the_grouped_query_model_trains_with_its_own_attention(tmp_path):
    res = run_training(compose_cfg(*QUICK, "accel=torch", "accel.patch=[loss]"), tmp_path)
    assert res["status"] == "completed" and res["patched"]["attention"] is None
    assert all(math.isfinite(x) for x in res["loss_curve"])
