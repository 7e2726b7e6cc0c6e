"""A Llama-family decoder (Llama 3.2, SmolLM2, Qwen2.5) with the GPT's two seams: attention core and loss.

Token embedding, pre-RMSNorm blocks (causal grouped-query attention with rotary positions on q and k,
a SwiGLU MLP), a final RMSNorm and an LM head, tied to the token embedding or not. Optional q/k/v
biases (Qwen2). One fused q/k/v projection C -> (H + 2 Hkv) d, laid out [q heads | k heads | v heads].

Grouped-query attention: ``n_kv_head`` (Hkv) key/value heads serve ``n_head`` (H) query heads, H % Hkv
== 0, and query head h reads kv head h // (H / Hkv) (SDPA's ``enable_gqa``, Hugging Face's
``repeat_kv``).

The seams are models.gpt's, so the harness drives this model exactly like the GPT (``set_attention``,
``attention_cores``, ``set_loss``, ``loss_fn`` / ``loss_form``, ``matmul_params``, ``flops_per_token``):

* attention: every block's core is called as ``attention_fn(q, k, v, scale, causal, dropout_p)`` with q
  (B, H, T, d) and k, v UNEXPANDED (B, Hkv, T, d), after RoPE: the ``kernels.attention`` contract, which
  every method takes (each serves a group of H / Hkv query heads its own way). The model's own default
  core (:func:`eager_gqa_attention`) expands k and v itself. Where the core has a ``qkv_fn`` (a method's
  native ``attention_qkv``), it gets the unsplit (B, T, (H + 2 Hkv) d) projection with q and k already
  rotated, and n_kv_head where Hkv < H (``AttentionCore.attend_qkv``).
* loss: ``loss_fn(logits (B*T, V), targets)``, or in the ``linear`` form ``loss_fn(hidden (B*T, C),
  lm_head.weight, targets)`` (the tied weight, when tied).

This module knows nothing of the acceleration methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.layouts import expand_kv
from models.gpt import GPT, AttentionCore, LossFn, SelfAttention, eager_attention, head_and_loss


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    context: int = 2048  # the longest sequence the rotary tables are built for
    n_layer: int = 30
    n_head: int = 9  # query heads (H)
    n_kv_head: int = 3  # key/value heads (Hkv): H % Hkv == 0
    n_embd: int = 576
    mlp_hidden: int = 1536  # the SwiGLU's hidden width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied: bool = True  # the LM head shares the token embedding's weight
    qkv_bias: bool = False  # biases on the q/k/v projection (Qwen2)
    dropout: float = 0.0  # the attention's (Hugging Face's attention_dropout); Llama has no other

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"the head dimension n_embd / n_head ({self.n_embd // self.n_head}) must be even: "
                             "RoPE rotates pairs of it")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


#: k or v (B, Hkv, T, d) expanded to (B, Hkv * groups, T, d): query head h reads kv head h // groups
repeat_kv = expand_kv


def eager_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                        dropout_p: float) -> torch.Tensor:
    """The model's own default attention (so the model runs standalone): k and v (B, Hkv, T, d) expanded
    to q's H heads, then the GPT's eager chain (scores in memory)."""
    groups = q.size(1) // k.size(1)
    return eager_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), scale, causal, dropout_p)  # (B, H, Tq, d)


def rope_tables(head_dim: int, context: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (context, 1, head_dim) of the rotary angles: position t turns the pair (i, i + d/2) of
    a head by t * theta^(-2i/d) (the rotate-half layout of Hugging Face's Llama). float32."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d/2,)
    angles = torch.outer(torch.arange(context, dtype=torch.float64), inv_freq)  # (context, d/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]  # (context, 1, d): both halves of a pair
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, nh, d) rotated by position: x cos + rotate_half(x) sin, with cos and sin (T, 1, d), in x's
    dtype (under autocast q and k stay 16-bit, as v is)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, nh, d/2) each
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, T, nh, d)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LlamaAttention(SelfAttention):
    """Causal grouped-query self-attention with RoPE on q and k; its ``core`` is the attention seam."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qkv_width = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.n_embd, qkv_width, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.core: nn.Module = AttentionCore(eager_gqa_attention, dropout=cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, d = self.n_head, self.n_kv_head, self.head_dim
        heads = self.qkv_proj(x).view(B, T, H + 2 * Hkv, d)  # (B, T, H + 2 Hkv, d)
        qk, v = heads.split([H + Hkv, Hkv], dim=2)  # (B, T, H + Hkv, d), (B, T, Hkv, d)
        qk = apply_rope(qk, cos, sin)  # q and k turned by their positions, one pass over both
        core = self.core
        if isinstance(core, AttentionCore) and core.qkv_fn is not None:
            # the method's attention_qkv takes the projection's layout (B, T, (H + 2 Hkv) d), q and k rotated
            y = core.attend_qkv(torch.cat((qk, v), dim=2).view(B, T, (H + 2 * Hkv) * d), H, Hkv)  # (B, H, T, d)
        else:
            q, k = qk.split([H, Hkv], dim=2)  # (B, T, H, d), (B, T, Hkv, d)
            y = core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, d); k, v (B, Hkv, T, d)
        y = y.transpose(1, 2).reshape(B, T, H * d)  # (B, T, H d)
        return self.o_proj(y)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): three matrices, hidden width ``mlp_hidden``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """x + attention(RMSNorm(x)), then x + SwiGLU(RMSNorm(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.norm_1, self.norm_2 = (nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps) for _ in range(2))
        self.attn, self.mlp = LlamaAttention(cfg), SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), cos, sin)
        return x + self.mlp(self.norm_2(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        cos, sin = rope_tables(cfg.head_dim, cfg.context, cfg.rope_theta)
        # not in the state dict: a pure function of the config, rebuilt with the model
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList([LlamaBlock(cfg) for _ in range(cfg.n_layer)])
        self.norm_f = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.lm_head.weight = self.wte.weight
        self.loss_fn: LossFn = F.cross_entropy  # the loss seam (models.set_loss, models.gpt.head_and_loss)
        self.loss_form = "logits"
        self.apply(GPT._init_weights)  # the GPT's init: N(0, 0.02) matrices, zero biases, unit norms
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits (B, T, vocab), loss); with targets in the ``linear`` loss form the logits are never
        built and None is returned in their place."""
        T = idx.shape[1]
        if T > self.config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.config.context}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, 1, d)
        x = self.wte(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x, cos, sin)
        return head_and_loss(self, self.norm_f(x), targets)  # norm_f's output: h (B, T, C)

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every weight matrix except an untied token
        embedding (a lookup); a tied one counts once, as the LM head. Norms and biases are not matmuls."""
        return sum(p.numel() for name, p in self.named_parameters()
                   if p.dim() >= 2 and not (name == "wte.weight" and not self.config.tied))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), the GPT's convention:

            6 * N_matmul + 12 * n_layer * (n_head * head_dim) * seq_len

        N_matmul (``matmul_params``): the q/k/v projection C (H + 2 Hkv) d (grouped-query attention's
        smaller k and v), the output projection H d C, the SwiGLU's three C x mlp_hidden matrices a
        layer, and the LM head. The second term is the attention scores and values (QK^T and AV: 2 * 2 *
        T * H d forward per token per layer, times 3; k and v's fewer heads are read by every query
        head, so they cost what full heads cost), over the full T x T square as is conventional.
        """
        c = self.config
        return 6.0 * self.matmul_params() + 12.0 * c.n_layer * c.n_head * c.head_dim * seq_len
