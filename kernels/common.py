"""Helpers shared by the pure-PyTorch methods: the causal mask and its fully masked rows."""

from __future__ import annotations

import functools

import torch


def causal_offset(tq: int, tk: int) -> int:
    """Key j is masked for query i when j > i + (Tk - Tq)."""
    return tk - tq


@functools.lru_cache(maxsize=64)
def _cached_mask(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    return torch.ones(tq, tk, dtype=torch.bool, device=device).triu(causal_offset(tq, tk) + 1)


def causal_mask(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where the key is masked. Cached per shape and device (a model
    would keep it as a buffer); built inline when traced by torch.compile so Inductor can fuse it."""
    if torch.compiler.is_compiling():
        i = torch.arange(tq, device=device)[:, None]
        j = torch.arange(tk, device=device)[None, :]
        return j > i + causal_offset(tq, tk)
    return _cached_mask(tq, tk, torch.device(device))


def fully_masked_rows(tq: int, tk: int) -> int:
    """How many leading query rows have no unmasked key (only when Tq > Tk)."""
    return max(0, tq - tk)
