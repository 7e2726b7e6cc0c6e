"""The command-line front of the Hydra apps (``harness.train``, ``harness.study``).

Every user error is one paragraph on stderr and exit status 2, before Hydra creates any directory:
an unknown group option (with the valid ones), an unknown key (with the valid keys there), a value of
the wrong type (the key, the value and the type it takes), a value out of range (``validate``), a
method that cannot run here (with the ones that can). ``--help`` prints harness.help's text instead of
Hydra's (which stays under ``--hydra-help``).
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from harness.config import CONF_DIR, group_options
from harness.help import help_text

#: exit status of a user error (a bad command line or config), as argparse uses
USAGE_ERROR = 2
#: exit status of a run or study stopped by Ctrl+C, as a shell reports a command killed by SIGINT (128 + 2)
EXIT_INTERRUPTED = 130

#: Hydra's flags that take a value (stripped before the overrides are parsed)
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--experimental-rerun"}
_CUSTOM_CONFIG_FLAGS = {"--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd"}


class UsageError(ValueError):
    """A user error whose message is the whole story (printed as one paragraph, exit status 2)."""


def fail(msg: str) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides)."""
    flags, overrides = [], []
    it = iter(argv)
    for a in it:
        if a in _FLAGS_WITH_VALUE:
            flags += [a, next(it, "")]
        elif a.startswith("-"):
            flags.append(a)
        else:
            overrides.append(a)
    return flags, overrides


def is_multirun(argv: list[str]) -> bool:
    return "-m" in argv or "--multirun" in argv


def _groups(conf_dir: str) -> set[str]:
    return {p.name for p in Path(conf_dir).iterdir() if p.is_dir()}


def unknown_key_message(cfg: DictConfig, key: str) -> str | None:
    """None when ``key`` (dotted) exists in ``cfg``; else a message listing the valid keys there (and the
    closest one, for a typo)."""
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig) or part not in node:
            where = ".".join(parts[:i]) or "the top level"
            names = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
            return (
                f"unknown config key '{key}': '{part}' is not a key of {where}.{_did_you_mean(part, names, parts[:i])} "
                f"Valid keys there: {', '.join(names)}. (A '+' prefix adds a key that nothing in the harness reads: "
                "only for code of your own that reads it.)"
            )
        node = node[part] if OmegaConf.is_dict(node) else None
    return None


def _did_you_mean(part: str, names: list[str], prefix: list[str]) -> str:
    close = difflib.get_close_matches(part, names, n=1, cutoff=0.75)
    return f" Did you mean '{'.'.join([*prefix, close[0]])}'?" if close else ""


def added_key_message(cfg: DictConfig, key: str) -> str | None:
    """For a '+key=value' override: a message when the new key is a near-miss of a key the harness has
    (``trainer.max_step`` for ``trainer.max_steps``: added, it would be silently unread); None otherwise."""
    parent_key, _, last = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or last in parent:
        return None
    hint = _did_you_mean(last, sorted(str(k) for k in parent.keys()), parent_key.split(".") if parent_key else [])
    if not hint:
        return None
    return (f"'+{key}' adds a key nothing in the harness reads, so it would change nothing.{hint} "
            f"(To add it anyway, for code of your own: '++{key}=...'.)")


def expected_type(cfg: DictConfig, key: str) -> Optional[str]:
    """What the schema accepts at ``key`` ('an integer', 'true or false', ...), None if unknown."""
    parent_key, _, last = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or last not in parent:
        return None
    node = parent._get_node(last)
    kind = type(node).__name__
    text = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false",
            "StringNode": "a string", "ListConfig": "a list, e.g. [a,b]", "DictConfig": "a mapping, e.g. {k: v}"}
    what = text.get(kind)
    if what is None:
        return None
    return what + (" or null" if node._is_optional() else "")


def _first_paragraph(exc: BaseException) -> str:
    """Hydra's message without its config search path listing."""
    text = str(exc).split("\nConfig search path:")[0].strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _type_error(exc: BaseException) -> Optional[tuple[str, str]]:
    """(full key, omegaconf's message) of a wrong-type error somewhere in ``exc``'s causes."""
    seen = exc
    while seen is not None:
        key = getattr(seen, "full_key", None)
        if key and type(seen).__name__ == "ValidationError":
            return str(key), str(getattr(seen, "msg", "")).splitlines()[0]
        seen = seen.__cause__ or seen.__context__
    return None


def precheck_overrides(
    argv: list[str], conf_dir: str, config_name: str, validate: Callable[[DictConfig], None] | None = None
) -> None:
    """Exit with status 2 and a clear message, before Hydra creates any output directory, if a
    command-line override names an unknown group option or key, has the wrong type, or ``validate``
    rejects the composed config (``validate`` raises ValueError, e.g. ConfigError)."""
    flags, args = split_argv(argv)
    if any(f in _CUSTOM_CONFIG_FLAGS for f in flags):
        return  # somebody else's configs: Hydra alone knows them
    # (no overrides: the default config is still validated, e.g. a study whose reference cannot fit here)
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException as exc:
        fail(f"cannot read the command line: {_first_paragraph(exc)}")
    sweep = next((o.input_line for o in overrides if o.is_sweep_override()), None)
    if sweep and not is_multirun(flags):  # Hydra's own answer is a multi-line traceback and exit 1
        fail(f"{sweep} gives several values (a sweep): use -m to sweep over them (e.g. `-m {sweep}`, one run each), "
             "or give one value.")
    groups = _groups(conf_dir)
    choices, keys, added = [], [], []
    for o in overrides:
        key = o.key_or_group
        hydra_key = re.split(r"[./]", key)[0] == "hydra"  # (hydra.run.dir, hydra/launcher=...: Hydra's own)
        if o.is_add() and not o.package and not hydra_key:
            added.append(key)
        if o.package or o.is_add() or o.is_force_add() or o.is_delete() or hydra_key:
            continue
        if key in groups:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
            valid = group_options(key, conf_dir)
            for v in values:
                if str(v) not in valid:
                    fail(f"unknown {key} option {v!r} (there is no {key}/{v}.yaml in {conf_dir}); valid {key} "
                         f"options: {', '.join(valid)}. `--help` says what each one is.")
            if values:
                choices.append(f"{key}={values[0]}")
        else:
            keys.append(key)
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=choices)
    except Exception as exc:
        fail(_first_paragraph(exc))
    for key in keys:
        msg = unknown_key_message(cfg, key)
        if msg:
            fail(msg)
    for key in added:
        msg = added_key_message(cfg, key)
        if msg:
            fail(msg)
    if any(o.is_sweep_override() for o in overrides) or is_multirun(flags):
        return  # sweeps: each job's config is checked by Hydra and by the job itself
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            full = compose(config_name=config_name, overrides=args)
    except Exception as exc:
        found = _type_error(exc)
        if found:
            key, detail = found
            raw = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0].lstrip("+~") == key), None)
            want = expected_type(cfg, key)
            shown = f"{key}={raw}" if raw is not None else key
            fail(f"config value {shown} has the wrong type: {key} takes {want}" if want else
                 f"config value {shown} is not accepted: {detail}")
        fail(_first_paragraph(exc))
    if validate is not None:
        try:
            validate(full)
        except ValueError as e:  # ConfigError, DataError, UsageError: said before any directory exists
            fail(str(e))


def wants_help(argv: list[str]) -> bool:
    return "--help" in argv or "-h" in argv


def run_app(hydra_main: Callable[[], None], config_name: str, validate: Callable[[DictConfig], None] | None,
            app: str = "train") -> None:
    """The entry point of a Hydra app (train, study): ``--help``, clear errors for bad overrides, then Hydra."""
    argv = sys.argv[1:]
    if wants_help(argv):
        print(help_text(app, CONF_DIR, config_name))
        sys.exit(0)
    precheck_overrides(argv, CONF_DIR, config_name, validate=validate)
    try:
        hydra_main()
    except KeyboardInterrupt:  # Ctrl+C: what finished is recorded (the run or study said where); no traceback
        sys.exit(EXIT_INTERRUPTED)
