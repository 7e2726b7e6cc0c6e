"""Hugging Face causal LMs (model.family=hf) through the harness's seams: every method that runs here
against the unpatched transformers model (float64 reference, tolerance from float32's own error), both
loss forms, on a Llama, a Qwen2 and a GPT-2 (no grouped-query attention); the seam's contract (k and v
unrepeated, the model's scaling, masks refused); the refusals before any work; training and a study."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from harness.accel import apply_accel
from harness.build import build_model
from harness.config import ConfigError, validate
from harness.gate import RunShapes, run_gate
from harness.memory import step_memory
from harness.training import run_training
from models import attention_cores, set_attention
from models.hf import HFCausalLM, UnsupportedMaskError, load_transformers
from models.llama import eager_gqa_attention
from tests.test_train import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
tf = load_transformers()
VOCAB = 61
#: the three model types, tiny: (model_type, the config's keys)
TYPES = {
    "llama": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2": dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                 bos_token_id=None, eos_token_id=None),
}
METHODS = [m for m in kernels.runnable_methods(op="attention") if not kernels.get_method(m).peer]
SLOW = {"compile", "flash"}  # a compile per shape; flash's kernels in Triton's interpreter


def transformers_model(model_type: str, seed: int = 0):
    torch.manual_seed(seed)
    config = tf.AutoConfig.for_model(model_type, vocab_size=VOCAB, **TYPES[model_type])
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def loss_and_grads(forward, params) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = forward()
    grads = torch.autograd.grad(loss, params)
    return loss.detach().double(), [g.double() for g in grads]


def reference(ref, idx, tgt):
    """The unpatched transformers model's loss (its logits, F.cross_entropy) and parameter gradients."""
    params = list(ref.parameters())
    return loss_and_grads(lambda: torch.nn.functional.cross_entropy(
        ref(input_ids=idx).logits.flatten(0, 1).float(), tgt.flatten()), params)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


#: (method, loss form): both forms where the method computes a loss (sdpa, flash: attention only, the loss
#: the model's own F.cross_entropy on the logits)
FORMS = [(m, f) for m in METHODS for f in ("logits", "linear")
         if f == "logits" or kernels.get_method(m).provides("cross_entropy")]


@pytest.mark.parametrize("model_type", list(TYPES))
@pytest.mark.parametrize("method,loss_form", [pytest.param(m, f, marks=pytest.mark.slow) if m in SLOW else (m, f)
                                              for m, f in FORMS])
def test_every_method_matches_the_unpatched_transformers_model(method, model_type, loss_form):
    ref = transformers_model(model_type)
    idx, tgt = torch.randint(0, VOCAB, (2, 13)), torch.randint(0, VOCAB, (2, 13))
    want_loss, want_grads = reference(copy.deepcopy(ref).double(), idx, tgt)  # float64: the truth
    f32_loss, f32_grads = reference(ref, idx, tgt)  # float32 unpatched: what rounding alone costs
    model = HFCausalLM(copy.deepcopy(ref), context=32)
    applied = apply_accel(model, method, loss_form=loss_form)
    assert applied.attention in ("native", "composed") and not applied.attention_qkv  # no unsplit projection here
    assert bool(applied.loss) == bool(kernels.get_method(method).provides("cross_entropy"))
    assert model.loss_form == loss_form
    loss, grads = loss_and_grads(lambda: model(idx, tgt)[1], list(model.hf.parameters()))
    assert abs(loss - want_loss) <= 20 * abs(f32_loss - want_loss) + 1e-6 * abs(want_loss)
    names = [n for n, _ in ref.named_parameters()]
    for name, g, w, g32 in zip(names, grads, want_grads, f32_grads):
        assert rel(g, w) <= 20 * rel(g32, w) + 2e-5, name


@pytest.mark.parametrize("method", ["sdpa", "torch"])
def test_under_autocast_the_seam_takes_ropes_float32_q_k_beside_a_16_bit_v(method):
    """Under bf16 autocast a transformers model hands its attention q and k in float32 (RoPE's float32
    cos and sin) and v in bf16; the seam casts them to autocast's dtype as SDPA does, and the patched
    model's loss and gradients match the unpatched one's under the same autocast."""
    ref = transformers_model("qwen2")
    idx, tgt = torch.randint(0, VOCAB, (2, 13)), torch.randint(0, VOCAB, (2, 13))
    model = HFCausalLM(copy.deepcopy(ref), context=32)
    apply_accel(model, method, patch=["attention"])
    seen = []

    def recording(q, k, v, scale, causal, dropout_p):
        seen.append((q.dtype, k.dtype, v.dtype))
        return kernels.attention(q, k, v, scale=scale, causal=causal, method=method)

    set_attention(model, recording)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_grads = reference(ref, idx, tgt)
        loss, grads = loss_and_grads(lambda: model(idx, tgt)[1], list(model.hf.parameters()))
    assert seen == [(torch.bfloat16,) * 3] * 2
    assert abs(loss - want) <= 2e-2 * abs(want)
    for (name, _), g, w in zip(ref.named_parameters(), grads, want_grads):
        assert rel(g, w) <= 5e-2, name


def test_the_linear_form_never_builds_the_logits_and_reads_the_untied_head():
    model = HFCausalLM(transformers_model("qwen2"), context=32)
    seen = {}

    def linear_loss(hidden, weight, targets, **kw):
        seen["weight"] = weight
        return hidden.sum() * 0 + weight.sum() * 0

    apply_accel(model, "torch", patch=["attention"])
    model.loss_fn, model.loss_form = linear_loss, "linear"
    logits, _ = model(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    assert logits is None and seen["weight"] is model.hf.lm_head.weight
    assert model.hf.lm_head.weight is not model.hf.get_input_embeddings().weight  # untied


@pytest.mark.parametrize("model_type,kv", [("llama", 2), ("qwen2", 2), ("gpt2", 4)])
def test_the_seam_gets_q_and_unrepeated_k_v_with_the_models_scaling(model_type, kv):
    ref = transformers_model(model_type)
    model = HFCausalLM(copy.deepcopy(ref), context=32)
    assert len(attention_cores(model)) == 2
    calls = []

    def recording(q, k, v, scale, causal, dropout_p):
        calls.append((q.shape, k.shape, v.shape, scale, causal))
        return eager_gqa_attention(q, k, v, scale, causal, dropout_p)

    set_attention(model, recording)
    idx = torch.randint(0, VOCAB, (2, 9))
    model(idx)
    assert calls == [((2, 4, 9, 8), (2, kv, 9, 8), (2, kv, 9, 8), 8 ** -0.5, True)] * 2
    for m in list(model.hf.modules()) + list(ref.modules()):  # a scaling other than 1/sqrt(d) is honoured
        if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
            m.scaling = 0.3
    calls.clear()
    logits, _ = model(idx)
    assert {c[3] for c in calls} == {0.3}
    torch.testing.assert_close(logits, ref(input_ids=idx).logits, rtol=1e-4, atol=1e-5)


def test_a_padding_mask_is_refused_and_an_all_ones_mask_accepted():
    model = HFCausalLM(transformers_model("llama"), context=32)
    idx = torch.randint(0, VOCAB, (2, 7))
    ones = torch.ones(2, 7, dtype=torch.long)
    out = model.hf(input_ids=idx, attention_mask=ones, use_cache=False).logits
    torch.testing.assert_close(out, model(idx)[0])
    padded = ones.clone()
    padded[0, :3] = 0
    with pytest.raises(UnsupportedMaskError, match=r"padding \(zeros\).*plain causal attention only. Accepted"):
        model.hf(input_ids=idx, attention_mask=padded, use_cache=False)
    with pytest.raises(UnsupportedMaskError, match=r"an attention mask of shape \(2, 1, 7, 7\)"):
        model.hf(input_ids=idx, attention_mask=torch.ones(2, 1, 7, 7, dtype=torch.bool), use_cache=False)


def test_packed_sequences_are_refused_outside_the_harnesss_own_batch():
    model = HFCausalLM(transformers_model("qwen2"), context=32)
    idx = torch.randint(0, VOCAB, (1, 8))
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])  # two sequences in one row
    with pytest.raises(UnsupportedMaskError, match="a mask other than the causal one"):
        model.hf(input_ids=idx, position_ids=packed, use_cache=False)
    model.hf(input_ids=idx, position_ids=torch.arange(8)[None], use_cache=False)  # one sequence: causal


def test_a_sliding_window_shorter_than_the_sequence_is_refused():
    torch.manual_seed(0)
    config = tf.AutoConfig.for_model("qwen2", vocab_size=VOCAB, **TYPES["qwen2"], use_sliding_window=True,
                                     sliding_window=4, layer_types=["sliding_attention"] * 2)
    model = HFCausalLM(tf.AutoModelForCausalLM.from_config(config), context=32)
    model(torch.randint(0, VOCAB, (1, 4)))  # a window as long as the sequence: causal
    with pytest.raises(UnsupportedMaskError, match="sliding window shorter than the sequence"):
        model(torch.randint(0, VOCAB, (1, 8)))


@pytest.mark.slow  # a whole-model compile: a minute on two CPU cores
def test_the_whole_hf_model_compiles_with_the_seams_patched():
    model = HFCausalLM(transformers_model("qwen2"), context=32)
    apply_accel(model, "torch", loss_form="linear")
    idx = torch.randint(0, VOCAB, (2, 13))
    eager = model(idx, idx)[1]
    compiled = torch.compile(model)(idx, idx)[1]  # transformers cannot tell our positions from packed ones here
    compiled.backward()
    torch.testing.assert_close(compiled, eager)


def test_matmul_params_and_flops_from_the_configs_shapes():
    for model_type, per_layer in [("llama", 32 * (4 + 2 + 2) * 8 + 4 * 8 * 32 + 3 * 32 * 48),
                                  ("qwen2", 32 * (4 + 2 + 2) * 8 + 4 * 8 * 32 + 3 * 32 * 40),
                                  ("gpt2", 32 * 3 * 32 + 32 * 32 + 2 * 32 * 128)]:
        model = HFCausalLM(transformers_model(model_type), context=32)
        want = 2 * per_layer + VOCAB * 32  # the head once, tied or not; no embedding lookups
        assert model.matmul_params() == want, model_type
        assert model.flops_per_token(16) == 6 * want + 12 * 2 * 4 * 8 * 16


def test_transformers_here_runs_without_hub_kernels_and_kernels_stays_ours():
    import transformers.integrations.hub_kernels as hub
    from transformers.utils.import_utils import is_kernels_available

    assert sys.modules["kernels"] is kernels and hasattr(kernels, "get_method")  # this project's
    assert not is_kernels_available() and not hub.is_kernels_available()
    assert transformers_model("llama") is not None  # a model built (its modules import hub_kernels' names)


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: some 10 s here
def test_transformers_gets_no_hub_kernels_from_this_projects_kernels():
    code = ("import kernels, sys\n"
            "from models.hf import load_transformers\n"
            "tf = load_transformers()\n"
            "c = tf.AutoConfig.for_model('llama', hidden_size=16, intermediate_size=16, num_hidden_layers=1,"
            " num_attention_heads=2, vocab_size=11)\n"
            "tf.AutoModelForCausalLM.from_config(c)\n"
            "from transformers.utils.import_utils import is_kernels_available\n"
            "import transformers.integrations.hub_kernels as hub\n"
            "assert sys.modules['kernels'] is kernels and hasattr(kernels, 'get_method')\n"
            "assert not is_kernels_available() and not hub.is_kernels_available()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_harness_puts_this_projects_kernels_before_a_same_named_package(tmp_path):
    other = tmp_path / "site" / "kernels"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("IMPOSTOR = True\n")
    code = (f"import sys; sys.path[:0] = [{str(tmp_path / 'site')!r}]; sys.path.append({str(ROOT)!r})\n"
            "import harness, kernels\n"
            f"assert kernels.__file__ == {str(ROOT / 'kernels' / '__init__.py')!r}, kernels.__file__\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


HF = ["trainer=cpu", "logger=none", "data.max_bytes=300000", "data.seq_len=16", "data.batch_size=2"]


def refused(*overrides) -> str:
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*HF, *overrides))
    return str(err.value)


def test_the_refusals_name_what_was_wrong_and_what_is_accepted(tmp_path):
    msg = refused("model=hf_llama_tiny", "model.hf.config=null", f"model.hf.path={tmp_path / 'nowhere'}")
    assert "model.hf.path=" in msg and "local checkpoint directory holding a config.json" in msg
    msg = refused("model=hf_llama_tiny", "model.hf.config.model_type=nope")
    assert "model.hf.config.model_type='nope'" in msg and "qwen2" in msg and "llama" in msg
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    msg = refused("model=hf_llama_tiny", f"model.hf.config={tmp_path}")
    assert "model_type='vit' is not accepted: a transformers causal-LM model type" in msg and "gpt2" in msg
    msg = refused("model=hf_llama_tiny", "model.vocab_size=300", "data.vocab_size=400")
    assert "data.vocab_size=400" in msg or "model.vocab_size=300" in msg
    msg = refused("model=hf_llama_tiny", "model.vocab_size=200", "data.tokenizer=bytes")
    assert "model.vocab_size=200" in msg and "at least the data's vocabulary (256 tokens)" in msg
    msg = refused("model=hf_llama_tiny", "model.hf.config.num_hidden_layers=3")
    assert "model.n_layer=2" in msg and "3, what the HF config says" in msg
    msg = refused("model=hf_llama_tiny", "model.hf.config=null")
    assert "exactly one of model.hf.config" in msg
    assert "null with model.family=hf" in refused("model=hf_llama_tiny", "model.rope_theta=1.0")
    assert "a whole-model patch applies to a Hugging Face model" in refused("model=llama_tiny", "accel=liger_hf")


def test_a_config_json_builds_the_model_it_describes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}))
    cfg = compose_cfg(*HF, "model=hf_qwen2_tiny", f"model.hf.config={tmp_path / 'config.json'}")
    validate(cfg)
    model = build_model(cfg)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == 512 and model.config.context == 128


def test_a_local_checkpoint_is_loaded_with_its_weights(tmp_path):
    torch.manual_seed(0)
    config = tf.AutoConfig.for_model("llama", vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    saved = tf.AutoModelForCausalLM.from_config(config)
    saved.save_pretrained(tmp_path)
    cfg = compose_cfg(*HF, "model=hf_llama_tiny", "model.hf.config=null", f"model.hf.path={tmp_path}")
    validate(cfg)
    model = build_model(cfg)
    for (name, p), q in zip(saved.named_parameters(), model.hf.parameters()):
        assert torch.equal(p, q), name
    assert "null or 512" in refused("model=hf_llama_tiny", "model.hf.config=null", f"model.hf.path={tmp_path}",
                                    "model.vocab_size=600")


def test_without_transformers_model_hf_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "transformers.utils.import_utils", None)
    msg = refused("model=hf_llama_tiny")
    assert "model.family='hf'" in msg and "pip install -e '.[hf]'" in msg


def test_the_published_shapes_and_their_memory_estimate():
    for name, own in [("hf_qwen25_05b", "qwen25_05b"), ("hf_smollm2_135m", "smollm2_135m")]:
        cfg, own_cfg = compose_cfg("logger=none", f"model={name}"), compose_cfg("logger=none", f"model={own}")
        validate(cfg)
        for key in ("n_layer", "n_head", "n_kv_head", "n_embd", "mlp_hidden", "context", "vocab_size"):
            assert cfg.model[key] == own_cfg.model[key], (name, key)
        assert cfg.data.batch_size == own_cfg.data.batch_size
        with torch.device("meta"):
            model = build_model(cfg)
        with torch.device("meta"):
            own_model = build_model(own_cfg)
        assert model.matmul_params() == own_model.matmul_params()  # the same shape, counted the same way
        assert step_memory(cfg, gpu=True).params == step_memory(own_cfg, gpu=True).params


QUICK = [*HF, "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.window=1", "trainer.val_every=0",
         "trainer.val_batches=1"]


@pytest.mark.parametrize("model,method", [("hf_qwen2_tiny", "torch"),
                                          pytest.param("hf_llama_tiny", "triton", marks=pytest.mark.slow),
                                          pytest.param("hf_gpt2_tiny", "triton", marks=pytest.mark.slow)])
def test_training_an_hf_model_through_the_harness(tmp_path, model, method):
    res = run_training(compose_cfg(*QUICK, f"model={model}", f"accel={method}", "accel.loss_form=linear"), tmp_path)
    assert res["status"] == "completed" and res["patched"]["attention"] in ("native", "composed")
    assert res["patched"]["loss"] and res["patched"]["loss_form"] == "linear"
    assert res["gate"]["checked"] and {c["op"] for c in res["gate"]["checks"]} >= {"linear_cross_entropy"}
    assert all(math.isfinite(x) for x in res["loss_curve"])
    assert not res["patched"]["attention_qkv"] and res["flops_per_token"] > 0


def test_liger_is_reported_unavailable_here_with_the_reason():
    from harness.availability import accel_choices

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    for choice in accel_choices():
        if choice["name"] in ("liger_hf", "liger_hf_flce"):
            assert not choice["available"]
            assert "its model_patch 'liger': liger-kernel is not installed" in choice["reason"]


def test_a_whole_model_patch_stays_on_its_model(monkeypatch):
    """Liger's patch as it works (a fake of its API, liger-kernel not being installed here): it rewrites
    the modeling module and the class; the model gets them, the next model built is transformers' own."""
    import transformers.models.llama.modeling_llama as modeling

    def lce_forward(self, input_ids=None, labels=None, shift_labels=None, **kwargs):
        h = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        loss = torch.nn.functional.cross_entropy((h @ self.lm_head.weight.T).flatten(0, 1), shift_labels.flatten())
        return tf.modeling_outputs.CausalLMOutputWithPast(loss=loss * 0 + 42.0, logits=None)  # a loss to recognise

    def fake_rope(q, k, cos, sin, *args, **kwargs):
        calls.append("rope")
        return original_rope(q, k, cos, sin, *args, **kwargs)

    def apply_liger_kernel_to_llama(rope=True, fused_linear_cross_entropy=True, model=None):
        if rope:
            modeling.apply_rotary_pos_emb = fake_rope
        if fused_linear_cross_entropy:
            modeling.LlamaForCausalLM.forward = lce_forward

    calls, original_rope, original_forward = [], modeling.apply_rotary_pos_emb, modeling.LlamaForCausalLM.forward
    fake = type(sys)("liger_kernel.transformers")
    fake.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel", type(sys)("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    sys.modules["liger_kernel"].transformers = fake
    monkeypatch.setattr("harness.model_patch.liger_unavailable", lambda: None)
    monkeypatch.setitem(__import__("harness.model_patch").model_patch.MODEL_PATCHES, "liger",
                        (lambda: None, __import__("harness.model_patch").model_patch.apply_liger))
    model = HFCausalLM(transformers_model("llama"), context=32)
    applied = apply_accel(model, "sdpa", patch=["attention"], model_patch="liger")
    assert applied.model_patch["function"] == "apply_liger_kernel_to_llama" and model.native_loss
    idx = torch.randint(0, VOCAB, (2, 5))
    assert model(idx, idx)[1].item() == 42.0 and calls  # the patched loss and RoPE, on this model
    assert modeling.apply_rotary_pos_emb is original_rope and modeling.LlamaForCausalLM.forward is original_forward
    gate = run_gate(applied, RunShapes(heads=4, kv_heads=2, seq_len=8, head_dim=8, vocab=VOCAB, n_embd=32, tokens=16,
                                       dtype=torch.float32, device="cpu"))
    assert gate["checked"] and gate["unchecked"] == {
        "model_patch": "apply_liger_kernel_to_llama as shipped: judged by loss parity only"}  # sdpa's attention checked
    calls.clear()
    other = HFCausalLM(transformers_model("llama"), context=32)
    assert other(idx, idx)[1].item() != 42.0 and not calls  # the next model is transformers' own


@pytest.mark.slow
def test_a_study_of_an_hf_model(tmp_path):
    from harness.study.run import run_study
    from tests import study_methods as sm

    cfg = sm.study_cfg("model=hf_llama_tiny", "data.seq_len=16", "data.batch_size=2", "data.max_bytes=300000",
                       "model.vocab_size=512", "trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.window=3",
                       "study.methods=[torch,naive,triton,liger_hf]", "study.parity_tol=0.05")
    rows = run_study(cfg, tmp_path)
    status = {r.label: r.status for r in rows}
    assert status.pop("liger_hf") == "SKIPPED" and status.pop("torch") == "REFERENCE"
    assert set(status.values()) == {"PASS"}, status
    assert "hf_llama_tiny" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_the_step_breakdown_of_an_hf_model_brackets_its_attention_and_loss():
    from omegaconf import OmegaConf

    from harness.breakdown import profile_step
    from harness.config import AccelConfig

    cfg = compose_cfg(*QUICK, "model=hf_llama_tiny")
    accel = OmegaConf.merge(OmegaConf.structured(AccelConfig), {"name": "x", "method": "torch", "loss_form": "linear"})
    parts = profile_step(cfg, accel).parts
    assert parts["loss"].name == "loss (LM head + cross-entropy)"
    assert parts["attention"].fwd_ms > 0 and parts["matmuls"].fwd_ms > 0 and parts["loss"].fwd_ms > 0


@pytest.mark.slow
def test_an_interrupted_hf_run_resumes_to_the_uninterrupted_runs_losses(tmp_path):
    from tests.test_reliability import SignalAt
    from harness.resume import load_resume

    base = [*QUICK, "model=hf_qwen2_tiny", "trainer.max_steps=8", "trainer.window=2", "trainer.ckpt_every=4",
            "logger=csv"]
    full = run_training(compose_cfg(*base), tmp_path / "full")
    part = run_training(compose_cfg(*base), tmp_path / "part", extra_callbacks=(SignalAt(5),))
    assert part["status"] == "interrupted"
    cfg, previous = load_resume(tmp_path / "part")
    run_training(cfg, tmp_path / "part", previous=previous)
    saved = json.loads((tmp_path / "part" / "results.json").read_text())
    assert saved["status"] == "completed" and saved["steps_done"] == 8 and saved["segments"] == 2
    assert max(abs(a - b) for a, b in zip(saved["loss_curve"], full["loss_curve"])) < 1e-4
    assert list((tmp_path / "full").rglob("metrics.csv"))  # the CSV logger wrote its rows


def test_model_hf_takes_its_shapes_from_a_checkpoint_or_a_config(tmp_path):
    config = tf.AutoConfig.for_model("qwen2", vocab_size=600, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                                     num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    saved = tf.AutoModelForCausalLM.from_config(config)
    saved.save_pretrained(tmp_path / "ckpt")
    for source in (f"model.hf.path={tmp_path / 'ckpt'}", f"model.hf.config={tmp_path / 'ckpt' / 'config.json'}"):
        cfg = compose_cfg(*HF, "model=hf", source, "model.context=64")
        validate(cfg)  # the harness's shape keys are filled from the HF config, not compared
        m = cfg.model
        assert (m.n_layer, m.n_head, m.n_kv_head, m.n_embd, m.mlp_hidden, m.vocab_size) == (3, 6, 2, 96, 200, 600), source
        model = build_model(cfg)
        assert model.config.vocab_size == 600 and model.config.n_kv_head == 2
    assert "exactly one of model.hf.config" in refused("model=hf")
