"""Correctness gate: a softmax method checked against float64 on the shapes it will see, forward and
backward, before any of its numbers are trusted (training start-up and speedup studies)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

import kernels


@dataclass
class GateResult:
    method: str
    passed: bool
    fwd_error: float
    bwd_error: float
    shape: tuple
    dtype: str
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def check_softmax(
    method: str, shape: tuple, dtype: torch.dtype, device: str, scale: float, causal: bool = True, seed: int = 0
) -> GateResult:
    """Fresh random scores of ``shape``; relative errors of the method's output and input gradient
    against the float64 reference, each within the dtype's tolerance (or 3x the error of merely
    rounding the exact result to the dtype, whichever is larger)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(device=device, dtype=dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    name = str(dtype).replace("torch.", "")
    try:
        y = kernels.softmax(x, scale=scale, causal=causal, method=method)
        y.backward(dy)
    except Exception as exc:
        return GateResult(method, False, float("nan"), float("nan"), tuple(shape), name,
                          f"raised {type(exc).__name__}: {exc}")
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    ref = kernels.reference_softmax(x64, scale=scale, causal=causal)
    ref.backward(dy.to(torch.float64))
    fwd = kernels.relative_error(y, ref)
    bwd = kernels.relative_error(x.grad, x64.grad)
    ftol = kernels.tolerance("fwd", dtype, ref.detach())
    btol = kernels.tolerance("bwd", dtype, x64.grad)
    reasons = []
    if not fwd <= ftol:  # NaN fails too
        reasons.append(f"forward error {fwd:.2e} > {ftol:.1e}")
    if not bwd <= btol:
        reasons.append(f"backward error {bwd:.2e} > {btol:.1e}")
    if y.shape != x.shape or y.dtype != x.dtype:
        reasons.append(f"output {tuple(y.shape)} {y.dtype} differs from input {tuple(x.shape)} {x.dtype}")
    return GateResult(method, not reasons, fwd, bwd, tuple(shape), name, "; ".join(reasons))
