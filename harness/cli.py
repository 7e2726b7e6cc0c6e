"""Command-line helpers shared by the Hydra apps.

Hydra already rejects an unknown group option and lists the valid ones, and rejects a value of the
wrong type; for an unknown *key* it only says the key is not in the struct. ``precheck_overrides``
catches that case first and lists the keys that are valid at that level.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf


def _groups(conf_dir: str) -> set[str]:
    return {p.name for p in Path(conf_dir).iterdir() if p.is_dir()}


def unknown_key_message(cfg: DictConfig, key: str) -> str | None:
    """None when ``key`` (dotted) exists in ``cfg``; else a message listing the valid keys there."""
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig) or part not in node:
            where = ".".join(parts[:i]) or "the top level"
            valid = ", ".join(sorted(str(k) for k in node.keys())) if isinstance(node, DictConfig) else ""
            return (
                f"unknown config key '{key}': '{part}' is not a key of {where}. "
                f"Valid keys there: {valid}. (Prefix with '+' to add a new key on purpose.)"
            )
        node = node[part] if OmegaConf.is_dict(node) else None
    return None


def precheck_overrides(
    argv: list[str], conf_dir: str, config_name: str, validate: Callable[[DictConfig], None] | None = None
) -> None:
    """Exit with status 2 and a clear message, before Hydra creates any output directory, if a
    command-line override names an unknown key or ``validate`` rejects the composed config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args = [a for a in argv if not a.startswith("-")]
    if not args:
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return  # let Hydra report its own syntax error
    groups = _groups(conf_dir)
    choices, keys = [], []
    for o in overrides:
        key = o.key_or_group
        if o.package or o.is_add() or o.is_force_add() or o.is_delete() or key.split(".")[0] == "hydra":
            continue
        if key in groups:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
            if values:
                choices.append(f"{key}={values[0]}")
        else:
            keys.append(key)
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=choices)
    except Exception:
        return  # a bad group option: Hydra's own message lists the valid ones
    for key in keys:
        msg = unknown_key_message(cfg, key)
        if msg:
            _fail(msg)
    if validate is None or any(o.is_sweep_override() for o in overrides) or "-m" in argv or "--multirun" in argv:
        return  # sweeps: each job validates its own config
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            full = compose(config_name=config_name, overrides=args)
    except Exception:
        return  # a wrong type etc.: Hydra reports it with the key
    try:
        validate(full)
    except ValueError as e:  # ConfigError, DataError: say it before any directory is created
        _fail(str(e))


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def run_app(hydra_main: Callable[[], None], config_name: str, validate: Callable[[DictConfig], None] | None) -> None:
    """The entry point of a Hydra app (train, study): clear errors for bad overrides first, then Hydra."""
    from harness.config import CONF_DIR

    precheck_overrides(sys.argv[1:], CONF_DIR, config_name, validate=validate)
    hydra_main()
