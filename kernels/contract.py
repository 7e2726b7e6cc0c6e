"""The ops' contracts (the same for every method), by the names the method modules import.

Each contract is stated once, in its op's module of the table (:mod:`kernels.ops`): the docstring of
``kernels/ops/<op>.py`` says what the op computes, and its checks and bound wrapper enforce it before
a method's function runs (:func:`kernels.bind`). The method modules check inputs of their own entry
points with these functions; :func:`kernels.layouts.split_qkv` is the projection's split the
``attention_qkv`` contract is stated on.
"""

from __future__ import annotations

from kernels.ops.attention import check_attention
from kernels.ops.attention_qkv import check_attention_qkv
from kernels.ops.checks import REDUCTIONS, SUPPORTED_DTYPES, TARGET_DTYPES
from kernels.ops.cross_entropy import check_cross_entropy
from kernels.ops.linear_cross_entropy import check_linear_cross_entropy
from kernels.ops.softmax import check_scores
from kernels.layouts import split_qkv

__all__ = ["REDUCTIONS", "SUPPORTED_DTYPES", "TARGET_DTYPES", "check_attention", "check_attention_qkv",
           "check_cross_entropy", "check_linear_cross_entropy", "check_scores", "split_qkv"]
