"""data.tokenizer: a byte-level BPE trained on the corpus (round trip, vocabulary, cached), a user's
tokenizer.json, the corpus it makes, and the paths and sizes refused before any work."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from harness import tokenizer as tk
from harness.config import ConfigError, validate
from harness.data import data_vocab_size, make_corpus
from tests.test_train import compose_cfg

TEXT = "".join(f"def function_{i}(value):\n    return value * {i} + len('naïve text {i % 7}')\n\n"
               for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.u8"
    path.write_bytes(TEXT.encode())
    return path


def test_bpe_trains_on_the_corpus_and_round_trips_text(tmp_path, corpus):
    tok, path = tk.bpe_for(corpus, 300, tmp_path / "cache", "a test corpus")
    assert path.is_file() and tok.get_vocab_size() == 300  # 256 bytes and 44 merges
    ids = tok.encode(TEXT[:500]).ids
    assert len(ids) < 500 / 1.5  # merges: fewer tokens than bytes
    assert tok.decode(ids) == TEXT[:500]
    unseen = "¿qué? 東京 \t\r\n emoji 🙂"  # never in the corpus: byte-level still covers it
    assert tok.decode(tok.encode(unseen).ids) == unseen


def test_bpe_and_token_file_are_cached_by_corpus_and_size(tmp_path, corpus, monkeypatch, capsys):
    trained = []
    real = tk.train_bpe
    monkeypatch.setattr(tk, "train_bpe", lambda *a: (trained.append(a[1]), real(*a))[1])
    cache = tmp_path / "cache"
    first = tk.tokenized_corpus(corpus, "bpe", 300, cache)
    assert "training a byte-level BPE of 300 tokens" in capsys.readouterr().err  # the progress line
    json_file = cache / f"bpe-{corpus.stem}-300.json"
    stamps = json_file.stat().st_mtime_ns, first[0].stat().st_mtime_ns
    assert tk.tokenized_corpus(corpus, "bpe", 300, cache) == first
    assert (json_file.stat().st_mtime_ns, first[0].stat().st_mtime_ns) == stamps and trained == [300]
    tk.tokenized_corpus(corpus, "bpe", 280, cache)  # another size: another BPE
    assert trained == [300, 280]


def test_the_corpus_in_bpe_tokens_decodes_to_the_text(tmp_path):
    src = tmp_path / "book.txt"
    src.write_text(TEXT)
    data = OmegaConf.create({"name": "text", "path": str(src), "tokenizer": "bpe", "vocab_size": 300,
                             "val_fraction": 0.1, "cache_dir": str(tmp_path / "cache")})
    c = make_corpus(data, seq_len=16)
    assert c.vocab_size == 300 and c.train.dtype == np.uint16 and data_vocab_size(data) == 300
    (trained,) = (tmp_path / "cache").glob("bpe-text-*-300.json")  # named by the text's cached corpus
    tok = tk.load_file(trained)
    tokens = np.concatenate([c.train, c.val])
    assert int(tokens.max()) < 300
    assert tok.decode(tokens.tolist()) == TEXT


def test_a_users_tokenizer_json(tmp_path, corpus):
    _, path = tk.bpe_for(corpus, 290, tmp_path / "made", "")
    mine = tmp_path / "tokenizer.json"
    mine.write_bytes(path.read_bytes())
    out, dtype, vocab = tk.tokenized_corpus(corpus, str(mine), None, tmp_path / "cache")
    assert vocab == 290 and tk.tokenizer_vocab_size(str(mine), None) == 290
    ids = np.fromfile(out, dtype=dtype)
    assert tk.load_file(mine).decode(ids.tolist()) == TEXT


def test_wide_vocabularies_take_32_bit_ids():
    assert tk.token_dtype(65536) == np.uint16 and tk.token_dtype(151936) == np.uint32


@pytest.fixture
def small_tokenizer(tmp_path, corpus):
    return tk.bpe_for(corpus, 300, tmp_path / "made", "")[1]


def test_bad_paths_and_vocabularies_are_refused_naming_the_values(tmp_path, small_tokenizer):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("model=tiny", f"data.tokenizer={missing}"))
    assert f"data.tokenizer='{missing}'" in str(e.value) and "bytes, bpe, or the path of a tokenizer.json" in str(e.value)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(ConfigError, match="is not a tokenizer.json the tokenizers library reads"):
        validate(compose_cfg("model=tiny", f"data.tokenizer={garbage}"))
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("model=tiny", f"data.tokenizer={small_tokenizer}", "model.vocab_size=299"))
    assert "at most model.vocab_size (299)" in str(e.value) and "this one has 300" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("model=llama_tiny", "accel.patch=[loss]", "data.vocab_size=600"))
    assert "data.vocab_size=600" in str(e.value) and "at most model.vocab_size (512)" in str(e.value)
    with pytest.raises(ConfigError, match=r"data.vocab_size=None .* >= 256 with data.tokenizer=bpe"):
        validate(compose_cfg("model=tiny", "data.tokenizer=bpe"))
    validate(compose_cfg("model=tiny", f"data.tokenizer={small_tokenizer}", "model.vocab_size=300"))
    validate(compose_cfg("model=tiny", "data.tokenizer=bpe", "data.vocab_size=1024"))


def test_synthetic_tokens_must_fit_the_models_vocabulary():
    with pytest.raises(ConfigError, match=r"data.vocab_size=50304 .*at most model.vocab_size \(512\)"):
        validate(compose_cfg("model=llama_tiny", "accel.patch=[loss]", "data=synthetic"))
    validate(compose_cfg("model=llama_tiny", "accel.patch=[loss]", "data=synthetic", "data.vocab_size=512"))
