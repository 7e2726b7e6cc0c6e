"""The ``--help`` of the Hydra apps (``harness.train``, ``harness.study``): the accel configurations
(whether each runs here, and why not), the models, data, trainers and loggers, and the keys people
change most with their defaults and meanings (from the schema's comments, harness.config). Hydra's own
help stays under ``--hydra-help``.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.availability import accel_choices, leading_comment
from harness.config import field_comments, group_options


def _keys_help(cfg: DictConfig, keys: list[str]) -> list[str]:
    """'  key (default): meaning' for each key, the meaning taken from the schema's comments."""
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
    for group, title in (("model", "the model's shape"), ("data", "what it trains on"), ("trainer", "how it trains"),
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
                if "n_layer" in mm:
                    extra = (f"{mm.n_layer} layers, {mm.n_embd} wide, {mm.n_head} heads, context {mm.context}, "
                             f"batch {m.data.batch_size}")
                    if leading_comment(path):
                        extra += f" ({leading_comment(path)})"
                # (else a file whose shape comes from elsewhere, model=hf: its comment says what it is)
            lines.append(f"  {o:<{w}}  {extra or leading_comment(path)}")
    lines += ["", "keys people change most (key=default  meaning):"]
    lines += _keys_help(cfg, STUDY_KEYS if app == "study" else TRAIN_KEYS)
    lines += ["", "Every key is typed (harness/config.py): a wrong key, type or range fails at once, saying why.",
              "-m a=x,y runs a sweep; --cfg job prints the composed config; --hydra-help: Hydra's own help.",
              f"Configs: {conf_dir}"]
    if app == "study":
        lines += ["Examples:", "  python -m harness.study model=small study.methods=[torch,triton,cuda] study.compiled=[]",
                  "  python -m harness.study model=tiny trainer=cpu study.methods=[naive,torch] study.compiled=[] "
                  "trainer.max_steps=20   # a small study on a CPU (the vocabulary stays 50304: minutes)"]
    else:
        lines += ["Examples:", "  python -m harness.train accel=triton model=gpt2s",
                  "  python -m harness.train model=tiny trainer=cpu          # a quick CPU run",
                  "  python -m harness.train resume=outputs/runs/<run>       # continue an interrupted run",
                  "  python -m harness.train resume=outputs/runs/<run> trainer.max_steps=400   # extend a run"]
    return "\n".join(lines)
