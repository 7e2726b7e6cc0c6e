"""Shared test helpers: tolerances per dtype, a forward+backward check against float64, and a check that
a step never makes the host wait for the GPU."""

from __future__ import annotations

import torch

import kernels
from kernels import BWD_TOL, FWD_TOL, rounding_floor  # noqa: F401  (the single source of tolerances)


def assert_never_synchronizes(step) -> None:
    """``step`` (after one warm-up call: compiles, builds) issues no operation that makes the host wait for
    the device: torch's sync-debug mode raises on any, also in the autograd engine's device thread."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def random_scores(shape, dtype, device="cpu", spread=3.0, gen=None) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * spread).to(device=device, dtype=dtype)


def assert_close_to_reference(fwd: float, bwd: float, floors: tuple[float, float], dtype: torch.dtype) -> None:
    ftol = max(FWD_TOL[dtype], 3 * floors[0])
    btol = max(BWD_TOL[dtype], 3 * floors[1])
    assert fwd <= ftol, f"forward error {fwd:.2e} > {ftol:.2e}"
    assert bwd <= btol, f"backward error {bwd:.2e} > {btol:.2e}"


def check_method(
    method: str, x: torch.Tensor, scale: float, causal: bool, floors: list | None = None
) -> tuple[float, float]:
    """Run method forward+backward on x (any layout), compare with float64; returns (fwd, bwd) errors
    after asserting the contract's exact zeros on masked entries. ``floors``, if given, receives the
    rounding floors (see ``rounding_floor``) of the forward and backward references."""
    x = x.detach().requires_grad_(True)
    y = kernels.softmax(x, scale=scale, causal=causal, method=method)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    dy = torch.randn(y.shape, dtype=torch.float32).to(device=y.device, dtype=y.dtype)
    y.backward(dy)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    ref = kernels.reference_softmax(x64, scale=scale, causal=causal)
    ref.backward(dy.to(torch.float64))
    assert not torch.isnan(y).any(), "NaN in the output"
    assert not torch.isnan(x.grad).any(), "NaN in the gradient"
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        masked = torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1).to(y.device)
        assert (y.detach()[..., masked] == 0).all(), "masked entries must be exactly 0"
        assert (x.grad[..., masked] == 0).all(), "masked entries must get gradient exactly 0"
    fwd = kernels.relative_error(y, ref)
    bwd = kernels.relative_error(x.grad, x64.grad)
    if floors is not None:
        floors[:] = [rounding_floor(ref.detach(), x.dtype), rounding_floor(x64.grad, x.dtype)]
    return fwd, bwd


def ce_rows_reference(x, t, ignore_index, scale=None):
    """Float64 per-row losses and the gradient (softmax - onehot) * scale (0 on ignored rows)."""
    x64 = x.double()
    valid = t != ignore_index
    ts = torch.where(valid, t, torch.zeros_like(t))
    loss = torch.where(valid, torch.logsumexp(x64, -1) - x64.gather(1, ts[:, None])[:, 0], 0.0)
    p = torch.softmax(x64, -1)
    p.scatter_add_(1, ts[:, None], -valid[:, None].double())
    if scale is not None:
        p = p * (scale.double().reshape(-1, 1) if scale.numel() > 1 else scale.double().reshape(()))
    return loss, torch.where(valid[:, None], p, 0.0)
