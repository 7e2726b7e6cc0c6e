"""Whether W&B can go online: its API key found the way wandb finds it (WANDB_API_KEY, or the netrc
entry for the W&B host), the mode ``logger.mode=auto`` resolves to, and the refusal of an online logger
without a key, said before any work (wandb itself would fail at its first call, after the run directory
exists). Reads no network and imports no wandb: the config checks call it.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse


def wandb_host() -> str:
    """The W&B server's host name, as wandb reads it (WANDB_BASE_URL, default api.wandb.ai)."""
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    return urlparse(url if "//" in url else f"//{url}").hostname or "api.wandb.ai"


def wandb_key_configured() -> bool:
    """Whether wandb would find an API key without asking: WANDB_API_KEY, or a netrc entry (NETRC, else
    ~/.netrc) for the W&B host with a password. No network, no wandb import."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    try:
        auth = netrc.netrc(str(path)).authenticators(wandb_host())
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def wandb_mode(requested: str) -> str:
    """auto: WANDB_MODE if set, online if an API key is configured, else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if wandb_key_configured() else "offline"


def online_without_key_message(logger_cfg) -> Optional[str]:
    """The refusal for a W&B logger that would go online with no API key (wandb would fail at its first
    call, after the run directory exists); None when the logger can start."""
    if logger_cfg.name != "wandb" or wandb_mode(str(logger_cfg.mode)) != "online" or wandb_key_configured():
        return None
    how = ("logger.mode=online" if str(logger_cfg.mode) == "online"
           else f"logger.mode={logger_cfg.mode} with WANDB_MODE={os.environ.get('WANDB_MODE')}")
    return (f"{how} needs a W&B API key and none is configured (no WANDB_API_KEY, no entry for "
            f"{wandb_host()} in ~/.netrc): log in once with `wandb login`, or set WANDB_API_KEY, or use "
            "logger.mode=offline (the run is saved in its directory; `wandb sync` uploads it later).")
