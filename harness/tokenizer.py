"""Tokens of the text corpora (``data.tokenizer``): bytes, a byte-level BPE trained on the corpus, or a
user's ``tokenizer.json``.

* ``bytes`` (the default): one token per byte, vocabulary 256; the corpus file is its own token file.
* ``bpe``: a byte-level BPE (the GPT-2 / Llama 3 kind: 256 byte tokens, then merges) trained with the
  Hugging Face ``tokenizers`` library on the corpus itself at first use, ``data.vocab_size`` tokens at
  most (fewer where the corpus has fewer pairs worth merging); cached as ``bpe-<corpus>-<size>.json``
  beside the corpus (the harness's cache directory, ``HARNESS_CACHE``), so a corpus and a size are
  trained once.
* the path of a ``tokenizer.json`` (any the ``tokenizers`` library reads, e.g. a published model's).

The corpus is encoded once per tokenizer and cached beside it as a flat file of token ids (uint16 while
the vocabulary fits, uint32 beyond: Qwen2.5's 151936 tokens do not), memory-mapped by harness.data like
the byte corpora. Text is decoded as UTF-8 (an invalid byte becomes U+FFFD) before a tokenizer sees it.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.results import atomic_write_bytes

BYTES, BPE = "bytes", "bpe"
BYTE_VOCAB = 256  # the byte alphabet: bytes' whole vocabulary, a byte-level BPE's first tokens
CHUNK_CHARS = 1 << 20  # text handed to the tokenizer at a time, cut at line ends (the library parallelizes over chunks)


class TokenizerError(ValueError):
    """A tokenizer that cannot be used: the message says what was wrong."""


def tokenizer_file_vocab(path: str) -> int:
    """The vocabulary (added tokens included) of the ``tokenizer.json`` at ``path``; TokenizerError when
    there is no such file or the library cannot read it."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise TokenizerError(f"no file at {p}")
    try:
        return load_file(p).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the library raises a bare Exception for a malformed file
        raise TokenizerError(f"{p} is not a tokenizer.json the tokenizers library reads ({exc})") from exc


def tokenizer_vocab_size(spec: str, bpe_vocab: Optional[int]) -> int:
    """The vocabulary of ``data.tokenizer`` = ``spec``: 256 for bytes, ``bpe_vocab`` (data.vocab_size) for
    bpe, the file's for a path."""
    if spec == BYTES:
        return BYTE_VOCAB
    if spec == BPE:
        if bpe_vocab is None:
            raise TokenizerError("data.tokenizer=bpe needs data.vocab_size, the BPE's vocabulary")
        return int(bpe_vocab)
    return tokenizer_file_vocab(spec)


def load_file(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def text_chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """``text`` cut at line ends into pieces of about ``size`` characters (joined, they are ``text``)."""
    chunks, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def _say(line: str) -> None:
    # harness.data has no console of its own; stderr is where the run's own lines go
    print(f"harness: {line}", file=sys.stderr, flush=True)


def train_bpe(text: str, vocab_size: int, out: Path, what: str) -> Tokenizer:
    """A byte-level BPE of at most ``vocab_size`` tokens trained on ``text``, saved to ``out``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    chunks = text_chunks(text)
    _say(f"training a byte-level BPE of {vocab_size} tokens on {what} ({len(text) / 1e6:.1f}M characters); "
         f"first use only, cached as {out}")
    start = time.perf_counter()
    tok.train_from_iterator(chunks, trainer=trainer, length=len(chunks))
    atomic_write_bytes(out, tok.to_str().encode())
    _say(f"BPE trained in {time.perf_counter() - start:.1f} s: {tok.get_vocab_size()} tokens")
    return tok


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_to_file(tok: Tokenizer, text: str, out: Path) -> None:
    """Every token id of ``text`` under ``tok``, in order, as a flat file of ``token_dtype`` ids."""
    dtype = token_dtype(tok.get_vocab_size(with_added_tokens=True))
    parts = [np.asarray(e.ids, dtype=dtype) for e in tok.encode_batch(text_chunks(text), add_special_tokens=False)]
    atomic_write_bytes(out, np.concatenate(parts or [np.zeros(0, dtype)]).tobytes())


def _read_text(corpus: Path) -> str:
    return Path(corpus).read_bytes().decode("utf-8", errors="replace")


def bpe_for(corpus: Path, vocab_size: int, cache_dir: Path, what: str) -> tuple[Tokenizer, Path]:
    """The byte-level BPE of ``vocab_size`` trained on ``corpus`` (a byte file), from the cache or trained
    now; and its file."""
    out = Path(cache_dir).expanduser() / f"bpe-{Path(corpus).stem}-{vocab_size}.json"
    if out.is_file():
        return load_file(out), out
    return train_bpe(_read_text(corpus), vocab_size, out, what), out


def tokenized_corpus(corpus: Path, spec: str, vocab_size: Optional[int], cache_dir: Path,
                     what: str = "the corpus") -> tuple[Path, np.dtype, int]:
    """(token file, its dtype, the tokenizer's vocabulary) of the byte corpus ``corpus`` under
    ``data.tokenizer`` = ``spec`` (bpe, with ``vocab_size`` tokens at most, or a tokenizer.json's path);
    the BPE and the token file are made once and cached in ``cache_dir``."""
    cache_dir = Path(cache_dir).expanduser()
    if spec == BPE:
        tok, path = bpe_for(corpus, int(vocab_size), cache_dir, what)
    else:
        path = Path(spec).expanduser()
        tok = load_file(path)
    digest = hashlib.sha1(path.read_bytes()).hexdigest()[:12]  # the tokenizer's identity, whoever made it
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab)
    out = cache_dir / f"{Path(corpus).stem}-tok{digest}.u{dtype.itemsize * 8}"
    if not out.is_file():
        encode_to_file(tok, _read_text(corpus), out)
    return out, dtype, vocab

