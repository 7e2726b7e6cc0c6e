"""The shapes of the loss table (``python -m harness.bench loss``) and its command-line options.

Either ``--vocabs`` at ``--tokens`` (each capped at 4 GiB of bf16 logits) and the ``--linear`` shapes
(tokens, C, V; several separated by ';'), or ``--models``: each model config's cross-entropy at its
vocabulary and linear cross-entropy at (tokens, its n_embd, its vocabulary), tokens one step's
(data.batch_size x context; :mod:`harness.bench.model_shapes`), the rows named after the model.
"""

from __future__ import annotations

import argparse
from typing import Callable, Iterable, Union

from harness.bench.common import parse_ints, parse_shapes
from harness.bench.model_shapes import ModelShape, models_option

DEFAULT_VOCABS = "32768,50304,128256,262144"
DEFAULT_TOKENS = 16384
DEFAULT_LINEAR = "16384,768,50304"


def ce_tokens(tokens: int, v: int) -> int:
    """The rows a vocabulary's table rows take: at most 4 GiB of bf16 logits."""
    return max(1, min(tokens, (2**32 // 2) // v))


def _labelled(shapes: Iterable[tuple]) -> dict[tuple, str]:
    """Shape -> the model names that give it (joined; '' for a shape of the command line), each shape
    once, in order: two models of one shape are measured once."""
    out: dict[tuple, list[str]] = {}
    for *shape, name in shapes:
        names = out.setdefault(tuple(shape), [])
        if name and name not in names:
            names.append(name)
    return {shape: ", ".join(names) for shape, names in out.items()}


def loss_shapes(vocabs: list[int], tokens: int, linear: Union[None, tuple, list[tuple]],
                models: Iterable[ModelShape] = ()) -> tuple[dict[tuple, str], dict[tuple, str]]:
    """The cross-entropy groups {(tokens, V): model} and the linear shapes {(tokens, C, V): model}: each
    vocabulary at ``tokens`` (capped: :func:`ce_tokens`), the ``linear`` shape or shapes, and each model's
    (one step's tokens, uncapped: what the model's loss takes; its n_embd and vocabulary). A size below 1,
    a linear shape that is not three sizes or a model without a vocabulary of its own raises a ValueError."""
    models = list(models)
    if vocabs and (tokens < 1 or min(vocabs) < 1):
        raise ValueError(f"the cross-entropy takes vocabularies and a token count >= 1; got {vocabs} at {tokens} tokens")
    for m in models:
        if m.vocab is None:
            raise ValueError(f"model {m.name!r} sets no model.vocab_size (its vocabulary is its data's): the loss "
                             "bench takes model configs with a vocabulary of their own (e.g. smollm2_135m, "
                             "qwen25_05b, llama32_1b), or --vocabs and --linear")
    lin = [] if not linear else [tuple(linear)] if isinstance(linear[0], int) else [tuple(x) for x in linear]
    if any(len(x) != 3 or min(x) < 1 for x in lin):
        raise ValueError(f"linear cross-entropy shapes are (tokens, C, V), three sizes >= 1; got {lin}")
    ce = _labelled([(ce_tokens(tokens, v), v, "") for v in vocabs] + [(m.tokens, m.vocab, m.name) for m in models])
    return ce, _labelled([(*x, "") for x in lin] + [(m.tokens, m.n_embd, m.vocab, m.name) for m in models])


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocabs", default=None, help=f"comma-separated vocabularies (default {DEFAULT_VOCABS})")
    p.add_argument("--tokens", type=int, default=None, help=f"the vocabularies' tokens (default {DEFAULT_TOKENS})")
    p.add_argument("--linear", default=None, help="tokens,C,V shapes of the linear cross-entropy separated by ';' "
                   f"('' for none; default {DEFAULT_LINEAR})")
    p.add_argument("--models", default=None,
                   help="comma-separated model configs (conf/model/, e.g. smollm2_135m,qwen25_05b,llama32_1b): each "
                   "model's cross-entropy at its vocabulary and linear cross-entropy at (tokens, n_embd, vocabulary), "
                   "tokens one step's (data.batch_size x context), instead of --vocabs, --tokens and --linear")


def shapes_of(a: argparse.Namespace, error: Callable[[str], None]) -> tuple[list[int], int, list[tuple], list[ModelShape]]:
    """(vocabs, tokens, linear shapes, models) of the command line; ``error`` (the parser's) for --models
    given with --vocabs, --tokens or --linear, an unknown model or one without a vocabulary, a bad shape."""
    models = models_option(a, error, {"--vocabs": a.vocabs, "--tokens": a.tokens, "--linear": a.linear})
    if models is None:
        linear = DEFAULT_LINEAR if a.linear is None else a.linear
        lin = parse_shapes(error, "--linear", linear, 3) if linear.strip() else []
        tokens = DEFAULT_TOKENS if a.tokens is None else a.tokens
        try:
            vocabs = parse_ints(DEFAULT_VOCABS if a.vocabs is None else a.vocabs)
        except ValueError:
            error(f"--vocabs takes comma-separated integers (got {a.vocabs!r})")
        try:
            loss_shapes(vocabs, tokens, lin)
        except ValueError as exc:
            error(f"--vocabs, --tokens, --linear: {exc}")
        return vocabs, tokens, lin, []
    try:
        loss_shapes([], 1, None, models)  # (a model without a vocabulary: refused before any work)
    except ValueError as exc:
        error(f"--models: {exc}")
    return [], 1, [], models
