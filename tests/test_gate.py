"""The correctness gate's choices: approximate methods skip it; long rows check fewer heads."""

from __future__ import annotations

import torch

import kernels
from harness import gate
from harness.accel import Applied


def shapes(T: int, heads: int = 4) -> gate.RunShapes:
    return gate.RunShapes(heads=heads, seq_len=T, head_dim=16, vocab=256, n_embd=16 * heads, tokens=T,
                          dtype=torch.float32, device="cpu")


def test_long_rows_check_fewer_heads(monkeypatch):
    monkeypatch.setattr(gate, "GATE_SCORES", 2 * 64 * 64)  # room for two heads of 64 x 64 scores
    info = gate.run_gate(Applied("torch", attention="composed"), shapes(64))
    assert info["checked"] and tuple(info["shape"]) == (1, 2, 64, 64)
    info = gate.run_gate(Applied("torch", attention="composed"), shapes(32))
    assert tuple(info["shape"]) == (1, 4, 32, 32)  # short rows: every head, as before


def test_approximate_methods_skip_the_gate():
    m = kernels.Method(name="_test_approx", softmax=lambda x, s, c: kernels.softmax(x, scale=s, causal=c),
                       summary="approximate", approximate=True)
    kernels.register(m)
    try:
        info = gate.run_gate(Applied(m.name, attention="composed"), shapes(32))
        assert info == {"checked": False, "reason": "approximate by design: judged by loss parity only"}
    finally:
        kernels.unregister(m.name)


def test_a_skipped_loss_method_is_the_reason_when_only_the_loss_was_patched():
    """sdpa (attention not patched) with the floor's loss (timing-only): the record says why the loss
    went unchecked, not that nothing was patched."""
    info = gate.run_gate(Applied("sdpa", attention=None, loss="native", loss_method="floor"), shapes(32))
    assert info == {"checked": False, "reason": "timing-only method (not what its ops promise)"}
    assert gate.run_gate(Applied("torch"), shapes(32)) == {"checked": False, "reason": "nothing patched to check"}
