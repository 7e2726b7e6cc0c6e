"""A Hugging Face causal LM behind the seams of the harness's own models (``models.GPT``,
``models.Llama``), so every method, the gate, the study, the breakdown and the benchmarks drive it
unchanged:

* attention: each decoder layer's attention module gets a :class:`~models.hf.attention.HFAttentionSeam`
  (``harness_seam``), found by ``models.attention_cores`` and swapped by ``models.set_attention``; the model
  is switched to the attention registered by :mod:`models.hf.attention`, which calls it with the layer's
  q, unrepeated k, v and scaling;
* loss: ``forward(idx, targets)`` runs the base model (its final norm included) and hands the last
  hidden states to ``models.gpt.head_and_loss``, so ``loss_fn`` / ``loss_form`` / ``set_loss`` work as on
  the own models (the ``linear`` form reads the head weight, tied or not, and never builds the logits);
  transformers' loss path (``labels=``) never runs, unless a whole-model patch that computes the loss
  inside the model's own forward (Liger's fused linear cross-entropy) sets ``native_loss``;
* ``config`` (:class:`HFShapes`): the shapes the gate, the memory estimate and MFU read;
  ``matmul_params`` and ``flops_per_token`` counted from the model's weights.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.gpt import LossFn, head_and_loss
from models.hf.attention import ATTENTION_NAME, PLAIN_CAUSAL, HFAttentionSeam, register_attention


class HFModelError(ValueError):
    """A Hugging Face model the harness cannot drive through its seams (the message says why)."""


@dataclass
class HFShapes:
    """What the harness reads of a model's config (the own models' names), from the HF config."""

    model_type: str
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int
    context: int  # the longest sequence the harness trains on
    dropout: float  # the attention's dropout (HF's attention_dropout / attn_pdrop)
    tied: bool


def hf_shapes(config, context: int) -> HFShapes:
    """The shapes of a transformers ``PretrainedConfig`` (GPT-2's names are mapped by its attribute_map)."""
    n_head = int(config.num_attention_heads)
    n_embd = int(config.hidden_size)
    head_dim = getattr(config, "head_dim", None) or n_embd // n_head
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * n_embd
    dropout = getattr(config, "attention_dropout", None)
    if dropout is None:
        dropout = getattr(config, "attn_pdrop", 0.0)
    return HFShapes(model_type=str(config.model_type), n_layer=int(config.num_hidden_layers), n_head=n_head,
                    n_kv_head=int(getattr(config, "num_key_value_heads", None) or n_head), n_embd=n_embd,
                    head_dim=int(head_dim), mlp_hidden=int(mlp), vocab_size=int(config.vocab_size),
                    context=int(context), dropout=float(dropout or 0.0),
                    tied=bool(getattr(config, "tie_word_embeddings", True)))


def _decoder_attentions(model: nn.Module) -> list[nn.Module]:
    """Every decoder layer's attention module (transformers names them ``*Attention`` with a ``layer_idx``)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]


class HFCausalLM(nn.Module):
    """A transformers causal LM (``hf``) driven through the harness's attention and loss seams."""

    def __init__(self, hf: nn.Module, context: int):
        super().__init__()
        self.hf = hf
        self.config = hf_shapes(hf.config, context)
        head = hf.get_output_embeddings()
        if not isinstance(head, nn.Linear) or head.bias is not None:
            raise HFModelError(f"{type(hf).__name__}'s output layer is {head!r}: the loss seam takes an LM head "
                               "that is one bias-free linear layer (hidden @ weight.T)")
        for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(hf.config, key, None) not in (None, 1, 1.0):
                raise HFModelError(f"{type(hf).__name__} transforms its logits ({key}={getattr(hf.config, key)}): the "
                                   "loss seam computes the loss of hidden @ head weight as it is")
        positions = getattr(hf.config, "max_position_embeddings", None)
        if positions is not None and context > positions:
            raise HFModelError(f"model.context={context} exceeds the model's max_position_embeddings ({positions})")
        attentions = _decoder_attentions(hf)
        if len(attentions) != self.config.n_layer:
            raise HFModelError(f"{type(hf).__name__} has {len(attentions)} decoder attention modules and "
                               f"{self.config.n_layer} layers: the attention seam needs one per layer")
        for attn in attentions:  # one seam per layer (registered: models.attention_cores finds it)
            attn.harness_seam = HFAttentionSeam(self.config.dropout)
        register_attention()
        hf.set_attn_implementation(ATTENTION_NAME)
        self.loss_fn: LossFn = F.cross_entropy  # the loss seam (models.set_loss, models.gpt.head_and_loss)
        self.loss_form = "logits"
        self.native_loss = False  # True: the model's own forward computes the loss (a whole-model patch)
        self.fused_qkv = False  # no unsplit q/k/v projection: a method's attention_qkv has nothing to take
        #: (modeling module, names) a whole-model patch replaced there for this model alone: set during forward
        self.forward_globals: Optional[tuple[ModuleType, dict]] = None

    @property
    def lm_head(self) -> nn.Linear:
        """The model's output layer (the tied token embedding's weight, where tied)."""
        return self.hf.get_output_embeddings()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits (B, T, vocab), loss); with targets in the ``linear`` loss form the logits are never
        built and None is returned in their place."""
        T = idx.shape[1]
        if T > self.config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.config.context}")
        with self._patched_globals(), self._plain_causal():
            if self.native_loss and targets is not None:  # targets are already the next tokens: no second shift
                out = self.hf(input_ids=idx, labels=targets, shift_labels=targets, use_cache=False)
                if out.loss is None:
                    raise HFModelError(f"{type(self.hf).__name__}'s patched forward computed no loss from shift_labels")
                return out.logits, out.loss
            h = self.hf.base_model(input_ids=idx, use_cache=False).last_hidden_state  # (B, T, C), final norm applied
            return head_and_loss(self, h, targets)

    @contextmanager
    def _plain_causal(self) -> Iterator[None]:
        """The HF config marked (models.hf.attention.PLAIN_CAUSAL) while the model runs this batch."""
        setattr(self.hf.config, PLAIN_CAUSAL, True)
        try:
            yield
        finally:
            setattr(self.hf.config, PLAIN_CAUSAL, False)

    @contextmanager
    def _patched_globals(self) -> Iterator[None]:
        """The modeling module's names as a whole-model patch left them for this model, put back after."""
        if self.forward_globals is None:
            yield
            return
        module, names = self.forward_globals
        saved = {k: getattr(module, k) for k in names if hasattr(module, k)}
        for k, v in names.items():
            setattr(module, k, v)
        try:
            yield
        finally:
            for k in names:
                if k in saved:
                    setattr(module, k, saved[k])
                else:
                    delattr(module, k)

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every weight matrix but the embeddings
        (lookups: token and position), plus the LM head once (tied or not). Norms and biases are not
        matmuls. Counted from the weights: the q/k/v projections' own widths (grouped-query attention's
        smaller k and v), the MLP's two or three matrices."""
        lookups = {id(m.weight) for m in self.hf.modules() if isinstance(m, nn.Embedding)}
        head = self.lm_head.weight
        seen, n = {id(head)}, head.numel()
        for p in self.hf.parameters():
            if p.dim() >= 2 and id(p) not in seen and id(p) not in lookups:
                seen.add(id(p))
                n += p.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, the own models' convention (models.Llama.flops_per_token):
        6 * N_matmul + 12 * n_layer * (n_head * head_dim) * seq_len."""
        c = self.config
        return 6.0 * self.matmul_params() + 12.0 * c.n_layer * c.n_head * c.head_dim * seq_len
