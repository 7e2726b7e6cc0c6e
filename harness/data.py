"""Data: token corpora and a deterministic batch stream.

* ``stdlib`` (default): the Python standard library's own ``.py`` sources, which every Python
  installation has: no download, no account. Byte-level tokens (vocabulary 256), prepared once and
  cached as a token file that is memory-mapped.
* ``text``: the user's own text file, byte-level tokens, cached the same way.
* ``synthetic``: uniformly random tokens of a chosen vocabulary, for pure throughput runs.

``data.tokenizer`` turns a text corpus into other tokens than bytes (a byte-level BPE trained on it, or a
user's ``tokenizer.json``): harness.tokenizer, cached the same way.

The batch for training step ``s`` on rank ``r`` is a pure function of (seed, split, s, r): random
windows of the corpus drawn from a generator seeded by those numbers. So every method sees the same
batches in the same order, each rank sees different ones, and a resumed run continues at the same
data position (the stream starts at the trainer's restored global step).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from harness.results import atomic_write_bytes
from harness.tokenizer import BYTE_VOCAB, BYTES, tokenized_corpus, tokenizer_vocab_size


class DataError(ValueError):
    """A data problem the user can fix: the message says what and how."""


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts]
    return sorted(files)


def build_stdlib_corpus(cache_dir: Path, max_bytes: int) -> Path:
    """Concatenate the standard library's sources (sorted, so the corpus is reproducible) up to
    ``max_bytes`` into a cached byte-token file; built once, reused after."""
    tag = hashlib.sha1(f"{sys.version}|{max_bytes}".encode()).hexdigest()[:10]
    out = Path(cache_dir).expanduser() / f"stdlib-{tag}.u8"
    if out.exists():
        return out
    chunks, total = [], 0
    for p in stdlib_sources():
        try:
            b = p.read_bytes()
        except OSError:
            continue
        chunks.append(b + b"\n\n")
        total += len(b) + 2
        if total >= max_bytes:
            break
    atomic_write_bytes(out, b"".join(chunks)[:max_bytes])
    return out


def build_text_corpus(path: str, cache_dir: Path) -> Path:
    """Byte tokens of a user's text file, cached by the file's content hash."""
    src = Path(path).expanduser()
    if not src.is_file():
        raise DataError(f"data.path={path!r}: no such file (data=text needs an existing text file)")
    data = src.read_bytes()
    digest = hashlib.sha1(data).hexdigest()[:12]
    out = Path(cache_dir).expanduser() / f"text-{digest}.u8"
    if not out.exists():
        atomic_write_bytes(out, data)
    return out


@dataclass
class Corpus:
    """Tokens (bytes, or a tokenizer's ids) split into a train and a validation part (the last ``val_fraction``)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int = BYTE_VOCAB

    @classmethod
    def from_file(cls, path: Path, val_fraction: float, seq_len: int, what: str, dtype=np.uint8,
                  vocab_size: int = BYTE_VOCAB) -> "Corpus":
        size = Path(path).stat().st_size
        tokens = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        n_val = int(len(tokens) * val_fraction)
        need = seq_len + 2
        if len(tokens) - n_val < need or n_val < need:
            raise DataError(
                f"{what} has {len(tokens)} tokens: too short for seq_len={seq_len} with "
                f"val_fraction={val_fraction} (each split needs at least {need} tokens)"
            )
        return cls(train=tokens[: len(tokens) - n_val], val=tokens[len(tokens) - n_val :], vocab_size=vocab_size)


def _stream_seed(seed: int, split: str, step: int, rank: int) -> int:
    h = hashlib.blake2b(f"{seed}/{split}/{step}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


class BatchStream(IterableDataset):
    """Yields ready (x, y) batches of shape (batch, seq_len) for steps ``start .. stop - 1``.

    ``tokens`` None means synthetic uniform tokens in ``[0, vocab_size)``.
    """

    def __init__(
        self,
        tokens: Optional[np.ndarray],
        vocab_size: int,
        batch_size: int,
        seq_len: int,
        seed: int,
        split: str,
        start: int,
        stop: int,
        rank: int = 0,
    ):
        super().__init__()
        self.tokens, self.vocab_size = tokens, vocab_size
        self.batch_size, self.seq_len = batch_size, seq_len
        self.seed, self.split, self.start, self.stop, self.rank = seed, split, start, stop, rank

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(_stream_seed(self.seed, self.split, step, self.rank))
        B, T = self.batch_size, self.seq_len
        if self.tokens is None:
            seq = torch.randint(0, self.vocab_size, (B, T + 1), generator=g)
        else:
            starts = torch.randint(0, len(self.tokens) - T - 1, (B,), generator=g).numpy()
            idx = starts[:, None] + np.arange(T + 1)[None, :]
            seq = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # no __len__ on purpose: a resumed Lightning epoch would count the restored steps against it,
        # end early and start the stream over; unsized, the epoch simply runs to max_steps
        for step in range(self.start, self.stop):
            yield self.batch(step)


def make_corpus(data_cfg, seq_len: int) -> Optional[Corpus]:
    """The corpus for ``data.name`` (None for synthetic data)."""
    cache = Path(data_cfg.cache_dir).expanduser()
    if data_cfg.name == "synthetic":
        return None
    if data_cfg.name == "stdlib":
        path, what = build_stdlib_corpus(cache, data_cfg.max_bytes), "the stdlib corpus"
    elif data_cfg.name == "text":
        path, what = build_text_corpus(data_cfg.path, cache), f"data.path={data_cfg.path!r}"
    else:
        raise DataError(f"unknown data.name={data_cfg.name!r}; accepted: stdlib, text, synthetic")
    if data_cfg.tokenizer != BYTES:  # the byte corpus encoded by the tokenizer (trained first for bpe)
        tokens, dtype, vocab = tokenized_corpus(path, data_cfg.tokenizer, data_cfg.vocab_size, cache, what)
        return Corpus.from_file(tokens, data_cfg.val_fraction, seq_len, what, dtype, vocab)
    return Corpus.from_file(path, data_cfg.val_fraction, seq_len, what)


def data_vocab_size(data_cfg) -> int:
    if data_cfg.name == "synthetic":
        return int(data_cfg.vocab_size)
    return tokenizer_vocab_size(data_cfg.tokenizer, data_cfg.vocab_size)


def loader(stream: BatchStream, pin_memory: bool) -> DataLoader:
    # batches come out of the stream ready-made: no collation, no worker processes needed (drawing a
    # batch costs microseconds); pinned memory lets the copy to the GPU run asynchronously
    return DataLoader(stream, batch_size=None, num_workers=0, pin_memory=pin_memory)
