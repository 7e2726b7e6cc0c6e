"""The attention and loss tables at grouped-query shapes and at model configs' shapes (``--models``):
harness/bench/model_shapes.py, loss_shapes.py and the two tables' command lines (CPU, tiny sizes)."""

from __future__ import annotations

import argparse
import csv
import functools
import re

import pytest

import kernels
from harness.bench import attention, loss
from harness.bench.loss_shapes import loss_shapes
from harness.bench.model_shapes import model_shape
from kernels.methods.sdpa import sdpa_attention

GQA = (1, 4, 2, 33, 16)  # B, H, Hkv, T, d: two query heads on each key/value head, odd T


def parse(module, argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    p = argparse.ArgumentParser(prog="bench")
    module.add_arguments(p)
    return p.parse_args(argv), p


def refused(module, argv: list[str], capsys, *, shapes: bool = True) -> str:
    """The parser's message for ``argv`` (it must exit)."""
    a, p = parse(module, argv)
    with pytest.raises(SystemExit):
        module.shapes_of(a, p.error) if shapes else module.run(a, p.error)
    return capsys.readouterr().err


def test_model_shape_reads_the_config_over_the_schema():
    s = model_shape("llama_tiny")
    assert s.attention == (8, 4, 2, 128, 16) and s.tokens == 8 * 128 and (s.n_embd, s.vocab) == (64, 512)
    gpt = model_shape("tiny")  # a GPT: Hkv = H; its vocabulary is its data's
    assert gpt.attention == (8, 4, 4, 128, 32) and gpt.vocab is None
    q = model_shape("qwen25_05b")
    assert q.attention == (8, 14, 2, 2048, 64) and (q.tokens, q.n_embd, q.vocab) == (16384, 896, 151936)
    with pytest.raises(ValueError, match=r"unknown model 'nope': the model configs \(conf/model/\) are .*llama_tiny"):
        model_shape("nope")


def test_attention_table_at_a_grouped_shape(tmp_path):
    """q with 4 heads, k and v with 2: every method checked against float64 with GQA, TFLOP/s of the query heads."""
    rows = attention.run_attention_bench(["naive", "torch", "sdpa"], [GQA], tmp_path, rep_ms=5)
    assert [r.method for r in rows] == ["naive", "torch", "sdpa"] and all(r.correct for r in rows), rows
    assert all((r.b, r.h, r.hkv, r.t, r.d, r.model) == (*GQA, "") for r in rows)
    for r in rows:  # the query heads' FLOPs, whatever Hkv
        assert r.fwd_tflops == pytest.approx(attention.causal_flops(1, 4, 33, 16) / (r.fwd_ms * 1e-3) / 1e12)
    md = (tmp_path / "attention.md").read_text()
    assert "| B, H, Hkv, T, d |" in md and "| sdpa | native | 1, 4, 2, 33, 16 |" in md
    assert [r["hkv"] for r in csv.DictReader((tmp_path / "attention.csv").open())] == ["2"] * 3
    # a 4-number shape is multi-head attention (Hkv = H)
    assert attention.run_attention_bench(["sdpa"], [(1, 2, 16, 8)], tmp_path, rep_ms=5)[0].hkv == 2


def test_attention_table_in_the_models_layout_at_a_grouped_shape(tmp_path):
    """layout qkv: one projection (B, T, (H + 2 Hkv) d), split with n_kv_head for methods without a native op."""
    rows = attention.run_attention_bench(["torch", "sdpa"], [GQA], tmp_path, rep_ms=5, layout="qkv")
    assert all(r.correct and r.fwd_bwd_tflops and r.hkv == 2 for r in rows), rows
    assert [r.provided for r in rows] == ["composed, split", "native, split"]
    assert "(B, T, (H + 2 Hkv) d)" in (tmp_path / "attention-qkv.md").read_text()


@pytest.mark.slow
def test_flash_in_the_table_at_a_grouped_shape(tmp_path):
    """flash (Triton's interpreter here): its grouped attention and its native attention_qkv given n_kv_head."""
    if "flash" not in kernels.runnable_methods(op="attention"):
        pytest.skip("flash cannot run here")
    shape = (1, 4, 2, 17, 16)
    rows = [attention.run_attention_bench(["flash"], [shape], tmp_path, rep_ms=5, layout=lay)[0]
            for lay in ("separate", "qkv")]
    assert all(r.correct and r.fwd_bwd_tflops and r.hkv == 2 for r in rows), rows
    assert [r.provided for r in rows] == ["native", "native (qkv)"]


@pytest.fixture
def throwaway_methods():
    """Two attention methods for the table: one that reads the wrong key/value head (h % Hkv instead of
    h // (H / Hkv)), and sdpa's efficient backend as a method of its own (its refusal of grouped heads
    happens before any CUDA call, so it shows on a CPU too)."""

    def interleaved(q, k, v, scale, causal, dropout_p):
        groups = q.shape[1] // k.shape[1]
        wrong = [x.repeat(1, groups, 1, 1) for x in (k, v)]  # head h on kv head h % Hkv
        return kernels.reference_attention(q, *wrong, scale=scale, causal=causal).to(q.dtype)

    names = {"gqa_interleaved_test": interleaved,
             "sdpa_efficient_test": functools.partial(sdpa_attention, backend="efficient")}
    for name, fn in names.items():
        kernels.register(kernels.Method(name=name, summary="test", attention=fn))
    yield list(names)
    for name in names:
        kernels.unregister(name)


def test_attention_table_marks_a_wrong_grouping_and_shows_a_refusal(tmp_path, throwaway_methods):
    wrong, efficient = attention.run_attention_bench(throwaway_methods, [GQA], tmp_path, rep_ms=5)
    assert wrong.correct is False and not wrong.error
    assert efficient.correct is None and efficient.fwd_ms is None
    assert efficient.error.startswith("refused: sdpa backend='efficient' does not take grouped-query attention")
    md = (tmp_path / "attention.md").read_text()
    assert "**NO**" in md and "| refused: sdpa backend='efficient' does not take grouped-query attention" in md


def test_attention_models_option_runs_each_models_shape(tmp_path):
    a, p = parse(attention, ["--models", "llama_tiny", "--methods", "torch,sdpa", "--rep-ms", "5", "--out", str(tmp_path),
                             "--layout", "qkv"])
    rows = attention.run(a, p.error)
    assert [(r.method, r.b, r.h, r.hkv, r.t, r.d, r.model) for r in rows] == [
        (m, 8, 4, 2, 128, 16, "llama_tiny") for m in ("torch", "sdpa")]
    assert all(r.correct for r in rows), rows
    assert "| 8, 4, 2, 128, 16 (llama_tiny) |" in (tmp_path / "attention-qkv.md").read_text()
    a, p = parse(attention, ["--models", "tiny, llama_tiny"])
    assert [s.attention for s in attention.shapes_of(a, p.error)] == [(8, 4, 4, 128, 32), (8, 4, 2, 128, 16)]


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "1,4,3,33,16"], "Hkv must divide H .*got H=4, Hkv=3"),
    (["--shapes", "1,4,33"], "takes shapes of 4 or 5 integers"),
    (["--shapes", "1,4,2,33,16,1"], "takes shapes of 4 or 5 integers"),
    (["--shapes", "1,0,33,16"], "every size must be >= 1"),
    (["--models", "llama_tiny", "--shapes", "1,4,33,16"], "--models and --shapes are both given"),
    (["--models", "nope"], "unknown model 'nope'"),
    (["--models", ","], "--models takes comma-separated model configs"),
])
def test_attention_bad_shapes_are_refused(argv, message, capsys):
    assert re.search(message, refused(attention, argv, capsys)), argv


def test_attention_bench_checks_every_shape_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="Hkv must divide H"):
        attention.run_attention_bench(["torch"], [(1, 2, 16, 8), (1, 6, 4, 16, 8)], tmp_path)
    assert not (tmp_path / "attention.md").exists()


def test_loss_models_option_gives_the_models_rows(tmp_path):
    a, p = parse(loss, ["--models", "llama_tiny", "--methods", "torch", "--rep-ms", "5", "--out", str(tmp_path)])
    rows = loss.run(a, p.error)
    ce = [r for r in rows if r.op == "cross_entropy"]
    lin = [r for r in rows if r.op == "linear_cross_entropy"]
    assert [(r.method, r.autocast) for r in ce] == [("torch", False), ("torch", True)]
    assert all((r.tokens, r.vocab, r.model) == (1024, 512, "llama_tiny") and r.correct for r in ce), ce
    assert [(r.method, r.tokens, r.hidden, r.vocab, r.model) for r in lin] == [("torch", 1024, 64, 512, "llama_tiny")]
    assert all(r.correct for r in lin), lin
    assert "| torch | linear_cross_entropy | 1024 x 512 (64) [llama_tiny] |" in (tmp_path / "loss.md").read_text()


def test_loss_several_linear_shapes(tmp_path):
    a, p = parse(loss, ["--vocabs", "33", "--tokens", "16", "--linear", "8,12,33;9,4,17", "--methods", "torch",
                        "--rep-ms", "5", "--out", str(tmp_path)])
    rows = loss.run(a, p.error)
    assert [(r.tokens, r.hidden, r.vocab) for r in rows if r.op == "linear_cross_entropy"] == [(8, 12, 33), (9, 4, 17)]
    assert all(r.correct for r in rows), rows


def test_loss_models_linear_rows_take_every_linear_method_by_default(tmp_path, monkeypatch):
    """Without --methods the linear rows hold every linear cross-entropy that runs here (liger, cce where they do)."""
    seen = []
    monkeypatch.setattr(loss, "measure_ce", lambda m, *args, **kw: loss.LossRow(m, "cross_entropy", 1, 1))
    monkeypatch.setattr(loss, "measure_linear",
                        lambda m, *args: seen.append(m) or loss.LossRow(m, "linear_cross_entropy", 1, 1, hidden=1))
    loss.run_loss_bench(None, [], 1, None, tmp_path, rep_ms=5, isolate=False, models=[model_shape("llama_tiny")])
    assert seen == loss.default_methods("linear_cross_entropy")
    assert set(seen) == set(kernels.runnable_methods(op="linear_cross_entropy"))


def test_loss_shapes_measure_one_shape_once():
    """Two model configs of one shape (qwen25_05b and its Hugging Face twin) give one group, named after both."""
    ce, lin = loss_shapes([262144], 16384, None, [model_shape("qwen25_05b"), model_shape("hf_qwen25_05b")])
    assert ce == {(8192, 262144): "", (16384, 151936): "qwen25_05b, hf_qwen25_05b"}  # the vocabularies' 4 GiB cap
    assert lin == {(16384, 896, 151936): "qwen25_05b, hf_qwen25_05b"}


@pytest.mark.parametrize("argv, message", [
    (["--models", "tiny"], "model 'tiny' sets no model.vocab_size"),
    (["--models", "llama_tiny", "--linear", "8,12,33"], "--models and --linear are both given"),
    (["--models", "llama_tiny", "--vocabs", "33", "--tokens", "8"], "--models and --vocabs, --tokens are both given"),
    (["--linear", "8,12;9,4,17"], "--linear takes shapes of 3 integers"),
    (["--linear", "8,0,33"], "three sizes >= 1"),
    (["--vocabs", "3,x"], "--vocabs takes comma-separated integers"),
    (["--vocabs", "0"], "vocabularies and a token count >= 1"),
])
def test_loss_bad_input_is_refused(argv, message, capsys):
    assert message in refused(loss, argv, capsys, shapes=False), argv


def test_a_model_config_without_a_shape_is_refused_by_name():
    from harness.bench.model_shapes import model_shape

    with pytest.raises(ValueError, match=r"model 'hf' takes its shape from a Hugging Face config.*llama_tiny"):
        model_shape("hf")
