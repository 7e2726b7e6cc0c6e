"""The GPU tests' failure line (tests/mismatch.py): where two attention-shaped tensors differ."""

from __future__ import annotations

import torch

from tests.mismatch import where


def test_where_names_the_heads_rows_tile_offsets_and_columns_that_differ():
    want = torch.randn(2, 3, 300, 64, generator=torch.Generator().manual_seed(0))
    got = want.clone()
    assert where(got, want, 1e-3, 1e-3).startswith("no element beyond atol 0.001 + rtol 0.001 |want|; the largest "
                                                    "difference, 0, at (0, 0, 0, 0)")
    scaled = want * 1.003  # a small error everywhere (fails a comparison of norms, no element's bound)
    assert f"at {tuple(int(i) for i in torch.unravel_index(want.abs().argmax(), want.shape))}" in where(
        scaled, want, 1e-2, 1e-2)
    got[1, 2, 64:128, :8] += 1.0  # the second consumer's rows of one 128-row tile, 8 columns
    got[0, 0, 299, 5] = float("nan")  # the last, partial tile
    text = where(got, want, 1e-3, 1e-3, tile=128)
    assert text.startswith("513 of 115200 elements differ (65 of 1800 rows, 1 not finite)")
    assert "heads (b, h) (0, 0), (1, 2)" in text and "rows 64-127, 299 of 300" in text
    assert "offsets in 128-row tiles 43, 64-127" in text and "columns 0-7" in text
    assert "first at (0, 0, 299, 5): got nan" in text


def test_where_shortens_long_lists_and_takes_three_dimensions():
    want = torch.zeros(4, 200, 16)
    got = want.clone()
    got[:, ::2, 0] = 1.0  # every other row: a hundred runs
    text = where(got, want, 0.1, 0.0)
    assert "rows 0, 2, 4, 6, 8, 10, 12, 14 and 92 more runs of 200" in text and "heads (b, h) (0, 0), (0, 1)" in text
