"""Data: the stdlib corpus, deterministic batch streams, errors for bad data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.data import BatchStream, Corpus, DataError, build_stdlib_corpus, build_text_corpus


def test_stdlib_corpus_is_built_once_and_reproducible(tmp_path):
    p1 = build_stdlib_corpus(tmp_path, 200_000)
    mtime = p1.stat().st_mtime_ns
    p2 = build_stdlib_corpus(tmp_path, 200_000)
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime and p1.stat().st_size == 200_000
    text = p1.read_bytes()
    assert b"def " in text and b"import" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_batches_are_a_function_of_seed_step_and_rank(tmp_path):
    corpus = Corpus.from_file(build_stdlib_corpus(tmp_path, 200_000), 0.05, 32, "stdlib")
    s = BatchStream(corpus.train, 256, 4, 32, seed=1, split="train", start=0, stop=10)
    batches = list(s)
    assert len(batches) == 10 and batches[0][0].shape == (4, 32) and batches[0][0].dtype == torch.int64
    x, y = batches[3]
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    resumed = list(BatchStream(corpus.train, 256, 4, 32, seed=1, split="train", start=3, stop=10))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches[3:], resumed))
    other_rank = BatchStream(corpus.train, 256, 4, 32, seed=1, split="train", start=0, stop=1, rank=1)
    assert not torch.equal(next(iter(other_rank))[0], batches[0][0])
    other_seed = BatchStream(corpus.train, 256, 4, 32, seed=2, split="train", start=0, stop=1)
    assert not torch.equal(next(iter(other_seed))[0], batches[0][0])


def test_synthetic_tokens_cover_the_vocabulary():
    s = BatchStream(None, 50304, 8, 64, seed=0, split="train", start=0, stop=1)
    x, _ = next(iter(s))
    assert x.max() < 50304 and x.min() >= 0 and x.unique().numel() > 400


def test_text_corpus_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        build_text_corpus(str(tmp_path / "missing.txt"), tmp_path)
    short = tmp_path / "short.txt"
    short.write_text("hello")
    path = build_text_corpus(str(short), tmp_path / "cache")
    with pytest.raises(DataError, match="too short"):
        Corpus.from_file(path, 0.05, 32, "short.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="too short"):
        Corpus.from_file(build_text_corpus(str(empty), tmp_path / "cache"), 0.05, 32, "empty.txt")


def test_text_corpus_tokens_are_the_file_bytes(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(bytes(range(256)) * 10)
    path = build_text_corpus(str(f), tmp_path / "cache")
    assert np.array_equal(np.memmap(path, dtype=np.uint8, mode="r"), np.frombuffer(f.read_bytes(), np.uint8))
