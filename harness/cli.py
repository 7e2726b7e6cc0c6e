"""The command-line front of the Hydra apps (``harness.train``, ``harness.study``).

Every user error is one paragraph on stderr and exit status 2, before Hydra creates any directory:
an unknown group option (with the valid ones), an unknown key (with the valid keys there), a value of
the wrong type (the key, the value and the type it takes), a value out of range (``validate``), a
method that cannot run here (with the ones that can). ``--help`` prints the methods (whether each runs
here, and why not), the models and data, and the keys people change most; Hydra's own help stays
under ``--hydra-help``.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.config import PATCHABLE, accel_methods, group_options

#: exit status of a user error (a bad command line or config), as argparse uses
USAGE_ERROR = 2

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
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    flags, args = split_argv(argv)
    if any(f in _CUSTOM_CONFIG_FLAGS for f in flags) or not args:
        return  # somebody else's configs: Hydra alone knows them
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException as exc:
        fail(f"cannot read the command line: {_first_paragraph(exc)}")
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


# -- methods and --help -------------------------------------------------------------------------------

def _comment(path: Path) -> str:
    """What a YAML file is, from its leading comment block (its first sentence), '@package' lines aside."""
    parts = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("#"):
            break
        if "@package" not in line:
            parts.append(line.lstrip("#").strip())
    text = " ".join(p for p in parts if p)
    return re.split(r"\.\s+(?=[A-Z])", text)[0].rstrip(".")


def accel_choices(conf_dir: Optional[str] = None) -> list[dict]:
    """Every accel configuration (conf/accel/*.yaml): name, method, options, summary, and whether it
    can run here (``reason`` says why not)."""
    import kernels
    from harness.config import CONF_DIR

    conf_dir = conf_dir or CONF_DIR
    known = kernels.available_methods(include_timing_only=True)
    out = []
    for name in group_options("accel", conf_dir):
        path = Path(conf_dir) / "accel" / f"{name}.yaml"
        raw = OmegaConf.load(path)
        method, options = str(raw.get("method")), dict(raw.get("options") or {})
        loss_method = raw.get("loss_method")
        a = known.get(method)
        reason = _unavailable(method, options, loss_method, raw.get("patch", PATCHABLE))
        # the plain config says what its method is; a variant (sdpa_flash) says what it changes
        summary = a.summary if (a and (name == method or not _comment(path))) else _comment(path)
        exact = all(known[m].exact for m in (method, loss_method) if m in known)
        out.append({"name": name, "method": method, "options": options, "loss_method": loss_method,
                    "available": not reason, "reason": reason or "", "summary": summary,
                    "exact": exact, "comment": _comment(path)})
    return out


def runnable_accel_names(conf_dir: Optional[str] = None) -> list[str]:
    """The accel configurations that can run on this machine."""
    return [c["name"] for c in accel_choices(conf_dir) if c["available"]]


def _unavailable(method: str, options: dict, loss_method: Optional[str] = None, patch=PATCHABLE) -> Optional[str]:
    """Why an accel configuration's methods (``method``, and ``loss_method`` for the loss) cannot run
    here (None: they can)."""
    import kernels

    for name, opts in accel_methods(method, loss_method, options, patch):
        try:
            reason = kernels.unavailable_reason(name, **opts)
        except (kernels.UnknownMethodError, ValueError) as exc:
            reason = str(exc)
        if reason:
            return reason if name == method else f"its loss_method {name!r}: {reason}"
    return None


def method_unavailable_message(accel_name: str, method: str, options: dict, loss_method: Optional[str] = None,
                               patch=PATCHABLE) -> Optional[str]:
    """None when accel=``accel_name`` can run here; else why not and which accel options can."""
    reason = _unavailable(method, options, loss_method, patch)
    if not reason:
        return None
    which = f"accel={accel_name}" + (f" (method {method!r})" if method != accel_name else "")
    return (f"{which} cannot run here: {reason.rstrip('.')}. "
            f"accel options that can run here: {', '.join(runnable_accel_names()) or 'none'}.")


def _keys_help(cfg: DictConfig, keys: list[str]) -> list[str]:
    """'  key (default): meaning' for each key, the meaning taken from the schema's comments."""
    from harness.config import field_comments

    comments = field_comments()
    rows = []
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value)
        if isinstance(value, list):
            value = "[" + ",".join(map(str, value)) + "]"
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        rows.append((f"{key}={shown}", comments.get(key, "")))
    width = max(len(r[0]) for r in rows)
    return [f"  {k:<{width}}  {m}" for k, m in rows]


TRAIN_KEYS = ["trainer.max_steps", "trainer.warmup_steps", "trainer.window", "trainer.val_every",
              "trainer.ckpt_every", "trainer.precision", "trainer.devices", "trainer.on_nonfinite",
              "data.batch_size", "data.seq_len", "data.path", "compile_model", "check_kernel", "seed",
              "logger.mode", "resume"]
STUDY_KEYS = ["study.methods", "study.compiled", "study.loss_split", "study.linear_loss", "study.reference",
              "study.baseline", "study.repeats", "study.sweep", "study.parity_steps", "study.parity_k",
              "study.parity_tol", "study.profile", "trainer.max_steps", "data.batch_size", "seed", "logger.mode"]


def help_text(app: str, conf_dir: str, config_name: str) -> str:
    """The ``--help`` of ``harness.train`` / ``harness.study``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        cfg = compose(config_name=config_name)
    defaults = {g: str(cfg[g].name) for g in ("accel", "model", "data", "logger") if g in cfg}
    lines = []
    if app == "study":
        lines += ["usage: python -m harness.study [group=option ...] [key=value ...]   (or harness-study)", "",
                  "Runs every method (study.methods, by default every accel config that runs here) end to end on",
                  "the same model, data, seed and batches, gates each (float64 check, loss parity with",
                  "study.reference) and writes report.md, results.csv and charts into outputs/studies/<time>_<model>/.",
                  ""]
    else:
        lines += ["usage: python -m harness.train [group=option ...] [key=value ...]   (or harness-train)", "",
                  "Trains a small GPT whose softmaxes are computed by the chosen method, checked against float64",
                  "first, and writes throughput (tokens/s, step time, MFU, memory) to results.json and W&B.", ""]
    lines.append("accel configs (study.methods picks among them; yes/no: whether each runs on this machine)" if app == "study"
                 else f"accel= (the method; default: {defaults.get('accel')}; yes/no: whether it runs on this machine)")
    choices = accel_choices(conf_dir)
    width = max(len(c["name"]) for c in choices)
    for c in choices:
        mark = "yes" if c["available"] else "no "
        timing = not c["exact"] and "timing only" not in c["summary"].lower()
        summary = c["summary"] + (" [timing only]" if timing else "")
        if c["options"]:
            summary += f" (options: {', '.join(f'{k}={v}' for k, v in c['options'].items())})"
        lines.append(f"  {c['name']:<{width}}  {mark}  {summary}")
        if not c["available"]:
            lines.append(f"  {'':<{width}}       not here: {c['reason']}")
    for group, title in (("model", "the GPT's shape"), ("data", "what it trains on"), ("trainer", "how it trains"),
                         ("logger", "where metrics go")):
        lines += ["", f"{group}= ({title}; default: {defaults.get(group, 'default')})"]
        opts = group_options(group, conf_dir)
        w = max(len(o) for o in opts)
        for o in opts:
            path = Path(conf_dir) / group / f"{o}.yaml"
            extra = ""
            if group == "model":
                m = OmegaConf.load(path)
                mm = m.model
                extra = (f"{mm.n_layer} layers, {mm.n_embd} wide, {mm.n_head} heads, context {mm.context}, "
                         f"batch {m.data.batch_size}")
                if _comment(path):
                    extra += f" ({_comment(path)})"
            lines.append(f"  {o:<{w}}  {extra or _comment(path)}")
    lines += ["", "keys people change most (key=default  meaning):"]
    lines += _keys_help(cfg, STUDY_KEYS if app == "study" else TRAIN_KEYS)
    lines += ["", "Every key is typed (harness/config.py): a wrong key, type or range fails at once, saying why.",
              "-m a=x,y runs a sweep; --cfg job prints the composed config; --hydra-help: Hydra's own help.",
              f"Configs: {conf_dir}"]
    if app != "study":
        lines += ["Examples:", "  python -m harness.train accel=triton model=gpt2s",
                  "  python -m harness.train model=tiny trainer=cpu          # a quick CPU run",
                  "  python -m harness.train resume=outputs/runs/<run>       # continue an interrupted run",
                  "  python -m harness.train resume=outputs/runs/<run> trainer.max_steps=400   # extend a run"]
    return "\n".join(lines)


def wants_help(argv: list[str]) -> bool:
    return "--help" in argv or "-h" in argv


def run_app(hydra_main: Callable[[], None], config_name: str, validate: Callable[[DictConfig], None] | None,
            app: str = "train") -> None:
    """The entry point of a Hydra app (train, study): ``--help``, clear errors for bad overrides, then Hydra."""
    from harness.config import CONF_DIR

    argv = sys.argv[1:]
    if wants_help(argv):
        print(help_text(app, CONF_DIR, config_name))
        sys.exit(0)
    precheck_overrides(argv, CONF_DIR, config_name, validate=validate)
    hydra_main()
