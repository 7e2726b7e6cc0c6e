"""A GPT-style decoder with two seams: its attention core and its loss.

Token + position embeddings, pre-LayerNorm blocks (causal multi-head attention, GELU MLP), a final
LayerNorm and an LM head tied to the token embedding (as in GPT-2 / nanoGPT).

The attention seam: every block's ``AttentionCore`` calls ``attention_fn(q, k, v, scale, causal,
dropout_p)`` with q, k, v of shape (B, nh, T, hs), ``scale = 1/sqrt(hs)``, ``causal=True`` and the
attention dropout (0 outside training); any function with that signature can be plugged in
(:func:`set_attention`), with, optionally, ``qkv_fn(qkv, n_head, scale, causal, dropout_p)``: the same
attention of the projection's output qkv (B, T, 3C) before it is split (its backward can then return
qkv's gradient as one tensor instead of three that autograd concatenates; the projection's layout,
q, k and v side by side, is :func:`kernels.layouts.split_qkv`'s, shared with the kernels). The loss seam: the model's
loss is ``loss_fn(logits (B*T, V), targets (B*T,))``, or, in the ``linear`` form, ``loss_fn(hidden (B*T,
C), lm_head.weight, targets)`` so that a fused linear cross-entropy never holds all the logits
(:func:`set_loss`; weight tying is kept: the weight handed over is the tied one). The defaults are the
model's own eager PyTorch (scale, mask, ``torch.softmax``; ``F.cross_entropy``), so the model runs
standalone. This module knows nothing of the acceleration methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.layouts import split_qkv

#: ``attention_fn(q, k, v, scale, causal, dropout_p) -> (B, nh, Tq, hs)`` (the contract of ``kernels.attention``)
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool, float], torch.Tensor]
#: ``qkv_fn(qkv (B, T, 3C), n_head, scale, causal, dropout_p) -> (B, nh, T, hs)`` (``kernels.attention_qkv``)
QkvAttentionFn = Callable[[torch.Tensor, int, float, bool, float], torch.Tensor]
#: ``loss_fn(logits (N, V), targets (N,)) -> mean loss`` or, linear form, ``loss_fn(hidden (N, C), weight (V, C), targets)``
LossFn = Callable[..., torch.Tensor]
LOSS_FORMS = ("logits", "linear")


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    context: int = 1024  # the longest sequence the position embedding supports
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                    dropout_p: float) -> torch.Tensor:
    """The model's own default attention (so the model runs standalone): scores in memory, scale,
    mask, torch.softmax, dropout, @ v."""
    scores = q @ k.transpose(-2, -1)  # (B, nh, Tq, Tk)
    x = scores * scale
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=x.device).triu(tk - tq + 1)
        x = x.masked_fill(mask, float("-inf"))
    att = torch.softmax(x, dim=-1).to(scores.dtype)
    if dropout_p:
        att = F.dropout(att, dropout_p, training=True)
    return att @ v  # (B, nh, Tq, hs)


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(hs)) v, causal, computed by a pluggable ``attention_fn`` (and ``qkv_fn``, when
    given, on the unsplit projection)."""

    def __init__(self, attention_fn: AttentionFn = eager_attention, dropout: float = 0.0,
                 qkv_fn: Optional[QkvAttentionFn] = None):
        super().__init__()
        self.attention_fn = attention_fn
        self.qkv_fn = qkv_fn
        self.dropout_p = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / math.sqrt(q.size(-1))
        return self.attention_fn(q, k, v, scale, True, self.dropout_p if self.training else 0.0)

    def attend_qkv(self, qkv: torch.Tensor, n_head: int, n_kv_head: Optional[int] = None) -> torch.Tensor:
        """The attention of the projection's output qkv (B, T, (nh + 2 n_kv_head) hs) -> (B, nh, T, hs):
        ``qkv_fn`` (given n_kv_head only where it is smaller than nh: grouped-query attention), or split
        into q, k, v views and ``forward``. n_kv_head None means nh (3C wide)."""
        if self.qkv_fn is None:
            return self(*split_qkv(qkv, n_head, n_kv_head))
        kv = n_head if n_kv_head is None else n_kv_head
        hs = qkv.shape[-1] // (n_head + 2 * kv)
        args = (qkv, n_head, 1.0 / math.sqrt(hs), True, self.dropout_p if self.training else 0.0)
        return self.qkv_fn(*args) if kv == n_head else self.qkv_fn(*args, kv)

    def extra_repr(self) -> str:
        names = [f"attention_fn={getattr(self.attention_fn, '__name__', repr(self.attention_fn))}"]
        if self.qkv_fn is not None:
            names.append(f"qkv_fn={getattr(self.qkv_fn, '__name__', repr(self.qkv_fn))}")
        return ", ".join(names)


class SelfAttention(nn.Module):
    """A block's attention whose ``core`` computes softmax(q k^T) v: what :func:`attention_cores` finds and
    :func:`set_attention` swaps, in every model family (the GPT's below, models.llama's)."""

    core: nn.Module


class CausalSelfAttention(SelfAttention):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.core: nn.Module = AttentionCore(dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.c_attn(x)
        if isinstance(self.core, AttentionCore):  # (its qkv_fn, where set, takes qkv unsplit)
            y = self.core.attend_qkv(qkv, self.n_head)  # (B, nh, T, hs)
        else:  # any other core (swap_attention_cores): forward(q, k, v)
            y = self.core(*split_qkv(qkv, self.n_head))
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.context, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.loss_fn: LossFn = F.cross_entropy  # the loss seam (see set_loss)
        self.loss_form = "logits"
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits (B, T, vocab), loss); with targets in the ``linear`` loss form the logits are never
        built and None is returned in their place."""
        B, T = idx.shape
        if T > self.config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.config.context}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return head_and_loss(self, self.ln_f(x), targets)  # ln_f's output: h (B, T, C)

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every weight except the position
        embedding and the norms; the tied token embedding counts once, as the LM head."""
        n = 0
        for name, p in self.named_parameters():
            if name.startswith("wpe") or ".ln_" in name or name.startswith("ln_f") or p.dim() < 2:
                continue
            n += p.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), as in the PaLM paper:

            6 * N_matmul + 12 * n_layer * n_embd * seq_len

        N_matmul: weights used in matmuls (including the LM head); the second term is the attention
        score and value matmuls (QK^T and AV: 2 * 2 * T * C forward per token per layer, times 3),
        counted over the full T x T square as is conventional (the causal half is not subtracted).
        """
        c = self.config
        return 6.0 * self.matmul_params() + 12.0 * c.n_layer * c.n_embd * seq_len


def head_and_loss(model: nn.Module, h: torch.Tensor, targets: torch.Tensor | None
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The loss seam of every model family, from the final hidden states h (B, T, C): (logits (B, T,
    vocab), loss); no targets: (logits, None); the ``linear`` form: (None, ``loss_fn(hidden, lm_head.weight,
    targets)``), the logits never built."""
    B, T, _ = h.shape
    if targets is None:
        return model.lm_head(h), None
    if model.loss_form == "linear":  # the loss reads the hidden states and the (tied) head weight
        return None, model.loss_fn(h.view(B * T, -1), model.lm_head.weight, targets.reshape(-1))
    logits = model.lm_head(h)  # (B, T, vocab)
    return logits, model.loss_fn(logits.view(B * T, -1), targets.reshape(-1))


def attention_cores(model: nn.Module) -> list[SelfAttention]:
    return [m for m in model.modules() if isinstance(m, SelfAttention)]


def swap_attention_cores(model: nn.Module, make_core: Callable[[], nn.Module]) -> Callable[[], None]:
    """Replace the attention core of every block by ``make_core()``; returns a function that undoes it."""
    attns = attention_cores(model)
    if not attns:
        raise ValueError("model has no CausalSelfAttention blocks to swap")
    old = [a.core for a in attns]
    for a in attns:
        a.core = make_core()

    def undo() -> None:
        for a, core in zip(attns, old):
            a.core = core

    return undo


def set_attention(model: nn.Module, attention_fn: AttentionFn,
                  qkv_fn: Optional[QkvAttentionFn] = None) -> Callable[[], None]:
    """Every block's attention computed by ``attention_fn`` (and by ``qkv_fn`` on the unsplit projection,
    when given; same dropout); returns the undo."""
    dropout = float(getattr(getattr(model, "config", None), "dropout", 0.0))  # a GPT's, a Llama's
    return swap_attention_cores(model, lambda: AttentionCore(attention_fn, dropout=dropout, qkv_fn=qkv_fn))


def set_loss(model: "GPT", loss_fn: LossFn, form: str = "logits") -> Callable[[], None]:
    """The model's loss computed by ``loss_fn`` in ``form`` (``logits``: ``loss_fn(logits, targets)``;
    ``linear``: ``loss_fn(hidden, weight, targets)``); returns the undo."""
    if form not in LOSS_FORMS:
        raise ValueError(f"loss form {form!r} is not accepted: one of {', '.join(LOSS_FORMS)}")
    old = (model.loss_fn, model.loss_form)
    model.loss_fn, model.loss_form = loss_fn, form

    def undo() -> None:
        model.loss_fn, model.loss_form = old

    return undo
