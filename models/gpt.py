"""A GPT-style decoder whose attention hands its materialized scores to a swappable softmax.

Token + position embeddings, pre-LayerNorm blocks (causal multi-head attention, GELU MLP), a final
LayerNorm and an LM head tied to the token embedding (as in GPT-2 / nanoGPT).

The softmax seam: ``MaterializedAttention`` computes ``scores = q @ k^T`` (B, nh, T, T) and calls
``softmax_fn(scores, scale, causal)`` with ``scale = 1/sqrt(head_dim)`` and ``causal=True``; any
function with that signature can be plugged in. ``SDPAttention`` is the reference core that calls
``torch.nn.functional.scaled_dot_product_attention`` (flash attention: the scores never exist in
memory), the upper bound beside any softmax. :func:`swap_attention_cores` replaces the core in every
block and returns a function that undoes it. This module knows nothing of the softmax methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

#: ``softmax_fn(scores, scale, causal) -> probabilities`` (the contract of ``kernels.softmax``)
SoftmaxFn = Callable[[torch.Tensor, float, bool], torch.Tensor]


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024  # the longest context the position embedding supports
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


def eager_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """The model's own default softmax (so the model runs standalone): scale, mask, torch.softmax."""
    x = scores * scale
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=x.device).triu(tk - tq + 1)
        x = x.masked_fill(mask, float("-inf"))
    return torch.softmax(x, dim=-1).to(scores.dtype)


class MaterializedAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v with the (B, nh, T, T) scores in memory and a pluggable softmax."""

    def __init__(self, softmax_fn: SoftmaxFn = eager_softmax, dropout: float = 0.0):
        super().__init__()
        self.softmax_fn = softmax_fn
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / math.sqrt(q.size(-1))
        scores = q @ k.transpose(-2, -1)  # (B, nh, T, T)
        att = self.softmax_fn(scores, scale, True)  # (B, nh, T, T), rows sum to 1
        return self.dropout(att) @ v  # (B, nh, T, hs)

    def extra_repr(self) -> str:
        return f"softmax_fn={getattr(self.softmax_fn, '__name__', repr(self.softmax_fn))}"


class SDPAttention(nn.Module):
    """Reference core: fused flash attention; the scores are never materialized."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout_p = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout_p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.core: nn.Module = MaterializedAttention(dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = self.core(q, k, v)  # (B, nh, T, hs)
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
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

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


def attention_cores(model: nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


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
