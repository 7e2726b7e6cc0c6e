"""MFU peak table and percentiles (the monitor itself is exercised by the training tests)."""

from __future__ import annotations

import pytest

from harness.throughput import peak_bf16_flops, percentile


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Some Future GPU", None),
        (None, None),
    ],
)
def test_peak_bf16_flops(name, peak):
    assert peak_bf16_flops(name) == peak


def test_percentile():
    assert percentile([3.0], 90) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


def test_spread_flags_noisy_runs():
    from harness.outcomes import NOISY_SPREAD
    from harness.throughput import spread

    assert spread(10.0, 10.5) == (1.05, False)
    s, noisy = spread(10.0, 12.0)
    assert s == pytest.approx(1.2) and noisy and NOISY_SPREAD == 1.10
    assert spread(None, 3.0) == (None, None)
