"""``transformers`` for the Hugging Face models: imported once, through :func:`load_transformers`, which
says how to install it when it is missing and keeps its hub-kernels integration off this project's
``kernels`` package.

The name clash: transformers 5 depends on Hugging Face's ``kernels`` package (kernels downloaded from
the Hub), whose top-level name is this project's ``kernels/``. transformers decides whether the hub
kernels are there with ``find_spec('kernels')`` and the version of the installed ``kernels``
distribution (``utils/import_utils.py``: ``is_kernels_available``), and on yes imports their API at
module level (``integrations/hub_kernels.py``: ``from kernels import CUDAProperties, ...``; the
``USE_HUB_KERNELS`` switch guards only their later use). With this project's ``kernels`` first on the
path both checks say yes (the spec is ours, the version Hugging Face's) and the import fails:
``ImportError: cannot import name 'CUDAProperties' from 'kernels'``. So, where the ``kernels`` Python
would import is not Hugging Face's, transformers is told the hub kernels are absent before it reads
the answer: no hub kernel is used or downloaded (the harness patches the model through its own seams),
and transformers' own modules run unchanged.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

INSTALL_HINT = "pip install -e '.[hf]' (transformers>=5.0,<5.25)"


class TransformersMissingError(ImportError):
    """model.family=hf without transformers installed (the message says how to install it)."""


def _hub_kernels_absent(*args, **kwargs) -> bool:
    """transformers' ``is_kernels_available`` where ``kernels`` is this project's: no hub kernels."""
    return False


_hub_kernels_absent._dynamo_marked_constant = True  # as transformers marks its own probe: a constant under compile


def _keep_hub_kernels_off_our_kernels() -> None:
    """Answer transformers' hub-kernels probe with no, wherever it is held, when the importable
    ``kernels`` is not Hugging Face's (it lacks their ``get_kernel``)."""
    if hasattr(importlib.import_module("kernels"), "get_kernel"):
        return  # Hugging Face's kernels package: transformers may use it as it means to
    import_utils = importlib.import_module("transformers.utils.import_utils")
    original = import_utils.is_kernels_available
    if original is _hub_kernels_absent:
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers") and getattr(module, "is_kernels_available", None) is original:
            module.is_kernels_available = _hub_kernels_absent


def load_transformers() -> ModuleType:
    """The ``transformers`` module, its hub-kernels probe kept off this project's ``kernels``; a clear
    error when it is not installed."""
    try:
        importlib.import_module("transformers.utils.import_utils")
    except ImportError as exc:
        raise TransformersMissingError(
            f"model.family=hf needs the transformers library, which is not installed here ({exc}): {INSTALL_HINT}"
        ) from exc
    _keep_hub_kernels_off_our_kernels()
    return importlib.import_module("transformers")
