"""The GPU's properties (SM count, shared memory per block, compute capability), asked of the driver once
per device: what the methods' launch plans size their grids and shared-memory buffers by."""

from __future__ import annotations

import torch

_DEVICE_PROPS: dict = {}


def device_props(device: torch.device):
    """``torch.cuda.get_device_properties(device)``, asked once per device (not every call)."""
    if device not in _DEVICE_PROPS:
        _DEVICE_PROPS[device] = torch.cuda.get_device_properties(device)
    return _DEVICE_PROPS[device]
