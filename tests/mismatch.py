"""Where two attention-shaped tensors differ, said in the terms a tiled kernel's bugs show in.

A failing comparison of a tiled kernel (which rows, which heads, which columns, which offsets inside a
tile) usually names its bug: every row at offsets 64-127 of each 128-row tile is the second consumer
warpgroup; the last, partial tile is the masking of rows past T; every other key tile a ring slot's
phase. The GPU tests put this line in their failure message, so one run says where to look.
"""

from __future__ import annotations

import torch


def _ranges(idx: list[int], most: int = 8) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (the first ``most`` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


def where(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, tile: int = 64) -> str:
    """One line: how many elements of ``got`` (B, H, T, d) are not within ``atol + rtol |want|`` of
    ``want`` or not finite, in which heads, rows (and row offsets inside ``tile``-row tiles) and columns,
    and the first of them."""
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    if g.dim() == 3:
        g, w = g.unsqueeze(0), w.unsqueeze(0)
    bad = ~torch.isclose(g, w, atol=atol, rtol=rtol) | ~torch.isfinite(g)
    if not bad.any():  # (a comparison of norms can fail on many small differences: say where they peak)
        diff = (g - w).abs()
        top = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        return (f"no element beyond atol {atol:.3g} + rtol {rtol:.3g} |want|; the largest difference, "
                f"{diff[top].item():.3g}, at {top}: got {g[top].item():.4g}, want {w[top].item():.4g}")
    B, H, T, _ = bad.shape
    rows = bad.any(-1)  # (B, H, T)
    heads = [tuple(x) for x in rows.any(-1).nonzero().tolist()]
    bad_rows = rows.any(0).any(0).nonzero().flatten().tolist()
    offsets = sorted({t % tile for t in bad_rows})
    cols = bad.any(0).any(0).any(0).nonzero().flatten().tolist()
    first = tuple(bad.nonzero()[0].tolist())
    nonfinite = int((~torch.isfinite(g)).sum())
    shown = ", ".join(map(str, heads[:6])) + (f" and {len(heads) - 6} more" if len(heads) > 6 else "")
    return (f"{int(bad.sum())} of {bad.numel()} elements differ ({int(rows.sum())} of {B * H * T} rows"
            + (f", {nonfinite} not finite" if nonfinite else "") + f"); heads (b, h) {shown}; "
            f"rows {_ranges(bad_rows)} of {T}; offsets in {tile}-row tiles {_ranges(offsets)}; "
            f"columns {_ranges(cols)}; first at {first}: got {g[first].item():.4g}, want {w[first].item():.4g}")
