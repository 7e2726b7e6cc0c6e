"""Hugging Face causal LMs (``transformers``, an optional dependency imported through
:func:`models.hf.library.load_transformers`) behind the harness's attention and loss seams."""

from models.hf.attention import ATTENTION_NAME, HFAttentionSeam, UnsupportedMaskError, register_attention
from models.hf.library import INSTALL_HINT, TransformersMissingError, load_transformers
from models.hf.model import HFCausalLM, HFModelError, HFShapes, hf_shapes

__all__ = ["ATTENTION_NAME", "HFAttentionSeam", "HFCausalLM", "HFModelError", "HFShapes", "INSTALL_HINT",
           "TransformersMissingError", "UnsupportedMaskError", "hf_shapes", "load_transformers", "register_attention"]
