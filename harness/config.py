"""Typed (structured) configs: the schema every YAML file under ``conf/`` is merged into.

Hydra rejects an unknown key or a value of the wrong type when it composes the config; ``validate``
rejects out-of-range values before any work starts, naming the key, the bad value and what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness.config_checks import model_problem, tokenizer_problem
from harness.wandb_auth import online_without_key_message


def _find_conf_dir() -> Path:
    """The Hydra configs: ``conf/`` at the top of a checkout (editable installs too), or the copy an
    installed wheel carries as ``harness/conf`` (pyproject.toml maps the one into the other)."""
    here = Path(__file__).resolve().parent
    candidates = (here / "conf", here.parent / "conf")
    for candidate in candidates:
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        "the harness's Hydra configs are missing: looked for config.yaml in "
        + " and ".join(str(c) for c in candidates) + " (reinstall the package: pip install .)"
    )


#: Where the Hydra configs are: the one place every Hydra app (train, study), the benchmarks and the
#: tests take them from (an absolute path, so ``hydra.main`` finds them from any working directory).
CONF_DIR = str(_find_conf_dir())


@dataclass
class AccelConfig:
    name: str = MISSING  # the label of this configuration in results and W&B (one file in conf/accel/)
    method: str = MISSING  # the kernels method (kernels.available_methods()) that computes the softmaxes
    patch: list = field(default_factory=lambda: ["attention", "loss"])  # which softmaxes it computes, where it can
    loss_form: str = "logits"  # logits (cross-entropy on the logits) | linear (fused linear + cross-entropy)
    options: dict = field(default_factory=dict)  # the method's options (sdpa: backend); not loss_method's
    loss_method: Optional[str] = None  # the method that computes the loss softmax; None: method
    qkv: bool = True  # the method's attention_qkv on the unsplit projection, where it has one; false: q, k, v views
    compiled_loss_method: Optional[str] = None  # with compile_model=true, the loss from this method instead (harness.fallback)
    model_patch: Optional[str] = None  # a Hugging Face model's whole-model patch (liger: Liger's own), after the method
    model_patch_options: dict = field(default_factory=dict)  # its keywords (liger: apply_liger_kernel_to_<type>'s)


@dataclass
class HFModelConfig:
    config: Any = None  # hf: a model_type plus the config's keys (a mapping), or a config.json (or its directory)
    path: Optional[str] = None  # hf: a local checkpoint directory (its weights; local files only)
    shapes_from_config: bool = False  # hf: take model.n_layer, n_head, n_kv_head, n_embd, mlp_hidden from it (model=hf)


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | small | gpt2s (one file in conf/model/)
    family: str = "gpt"  # gpt | llama | hf: the model class (models.GPT, models.Llama, a transformers causal LM)
    n_layer: int = 2  # transformer blocks
    n_head: int = 2  # attention heads
    n_embd: int = 64  # model width
    context: int = 64  # the longest sequence the position embedding supports
    dropout: float = 0.0
    bias: bool = False
    vocab_size: Optional[int] = None  # None: the data's vocabulary
    n_kv_head: Optional[int] = None  # llama: key/value heads (grouped-query attention); None: n_head
    mlp_hidden: Optional[int] = None  # llama: the SwiGLU's hidden width
    rope_theta: Optional[float] = None  # llama: the rotary base; None: 10000
    norm_eps: Optional[float] = None  # llama: the RMSNorm epsilon; None: 1e-5
    tied: Optional[bool] = None  # llama: the LM head is the token embedding (the GPT's always is); None: true
    qkv_bias: bool = False  # llama: biases on the q/k/v projection (Qwen2)
    hf: HFModelConfig = field(default_factory=HFModelConfig)  # hf: the transformers model (harness.hf)


@dataclass
class DataConfig:
    name: str = MISSING  # stdlib | text | synthetic
    path: Optional[str] = None  # the text file (data=text)
    vocab_size: Optional[int] = None  # synthetic tokens' vocabulary, or the BPE's (tokenizer=bpe); bytes use 256
    tokenizer: str = "bytes"  # bytes | bpe (trained on the corpus, cached) | the path of a tokenizer.json
    max_bytes: int = 16_000_000  # cap on the stdlib corpus size
    val_fraction: float = 0.05
    batch_size: int = 8  # sequences per step (per rank); each model file sets its own
    seq_len: Optional[int] = None  # training sequence length; None: the model's context
    seed: Optional[int] = None  # the batch order's seed; None: the run's seed (a study's spread run sets it)
    cache_dir: str = "~/.cache/softmax-harness"


@dataclass
class TrainerConfig:
    max_steps: int = 200  # optimizer steps to train (resume=<run> trainer.max_steps=N extends a run)
    warmup_steps: int = 5  # first steps (compile, autotune, allocator warm-up) kept out of throughput
    window: int = 10  # throughput window (steps); also the logging / progress-bar interval
    val_every: int = 100  # run validation every this many steps (0: only at the end)
    val_batches: int = 8  # validation batches per validation
    lr: float = 6e-4  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # the cosine decays to this fraction of lr
    lr_warmup_steps: int = 20  # linear learning-rate warm-up steps
    lr_decay_steps: Optional[int] = None  # steps the cosine decays over (None: max_steps); later steps keep the final lr
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    accelerator: str = "auto"  # auto | gpu | cpu
    devices: Any = 1  # GPUs per node (with trainer=ddp)
    num_nodes: int = 1  # hosts (with trainer=ddp, started by your scheduler)
    strategy: str = "auto"  # Lightning strategy (ddp with trainer=ddp)
    precision: str = "auto"  # auto: bf16-mixed on a GPU, 32-true on the CPU
    ckpt_every: int = 0  # save a checkpoint every this many steps (0: only on a graceful stop)
    on_nonfinite: str = "stop"  # stop | warn: what a NaN/inf training loss does


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | csv | none
    project: str = "softmax-harness"
    mode: str = "auto"  # auto (online when logged in or WANDB_MODE says so, else offline) | offline | online
    group: Optional[str] = None  # default: the sweep directory's name in a multirun
    tags: list = field(default_factory=list)


@dataclass
class TrainConfig:
    accel: AccelConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 1337  # model initialization and batch order
    compile_model: bool = False  # torch.compile the whole model (independent of the softmax method)
    compile_mode: str = "default"  # torch.compile mode for the whole model (reduce-overhead: CUDA graphs)
    check_kernel: bool = True  # gate: check the softmax against float64 on the run's shapes first
    resume: Optional[str] = None  # a run directory to continue (its config and checkpoints/last.ckpt)


@dataclass
class StudyConfig:
    """The study's keys (conf/study.yaml documents each; harness.study.checks.validate_study checks them)."""

    methods: Optional[list] = None  # accel configs to run; None: every one whose method can run here
    compiled: list = field(default_factory=lambda: ["naive", "triton", "cuda"])  # also with compile_model
    loss_split: list = field(default_factory=lambda: ["triton", "cuda"])  # also with accel.patch=[attention] (those in the study)
    linear_loss: list = field(default_factory=list)  # also with accel.loss_form=linear (fused linear CE)
    reference: str = "torch"  # the accel config every loss curve is compared with (parity)
    baseline: str = "naive"  # the accel config speedups are given against
    kernel_gate: bool = True  # false: no float64 gate before a run (parity alone judges)
    parity_steps: Optional[int] = None  # the parity window: the first K steps (None: the whole run)
    parity_every: Optional[int] = None  # probe the held-out loss every N steps (None: trainer.window)
    parity_batches: int = 2  # held-out batches in the probe
    parity_k: float = 3.0  # tolerance = max(parity_floor, parity_k * the reference's spread)
    parity_floor: float = 0.005  # the smallest tolerance (relative)
    parity_tol: Optional[float] = None  # a fixed tolerance instead (no spread run)
    repeats: int = 1  # runs of every method, interleaved round-robin; medians and 95% intervals
    sweep: Optional[str] = None  # None | context | model
    contexts: list = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])  # sweep=context
    tokens_per_step: Optional[int] = None  # sweep=context: batch = tokens / T (None: the model's batch x context)
    models: list = field(default_factory=lambda: ["small", "gpt2s", "gpt2m"])  # sweep=model
    profile: Optional[bool] = None  # where a step's time goes (eager runs); None: on when a GPU is there
    vocab_size: Optional[int] = None  # a GPT model's vocabulary where its config leaves model.vocab_size null


@dataclass
class StudyAppConfig(TrainConfig):
    study: StudyConfig = field(default_factory=StudyConfig)


ConfigStore.instance().store(name="train_schema", node=TrainConfig)
ConfigStore.instance().store(name="study_schema", node=StudyAppConfig)

PATCHABLE = ("attention", "loss")
LOSS_FORMS = ("logits", "linear")
DATA_KINDS = ("stdlib", "text", "synthetic")
LOGGER_KINDS = ("wandb", "csv", "none")
LOGGER_MODES = ("auto", "offline", "online", "disabled")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PRECISIONS = ("auto", "bf16-mixed", "16-mixed", "32-true", "32", "bf16-true")


def patch_words(patch, loss_form: str = "logits") -> str:
    """The softmaxes ``accel.patch`` and ``accel.loss_form`` ask for, in words: 'attention + loss',
    'attention', 'attention + linear loss' (a study's row labels, the suffix of a run's name)."""
    patch = list(patch)
    parts = ["attention"] if "attention" in patch else []
    if "loss" in patch:
        parts.append("linear loss" if loss_form == "linear" else "loss")
    return " + ".join(parts) or "nothing"


def accel_methods(method: str, loss_method: Optional[str] = None, options: Optional[dict] = None,
                  patch: Any = PATCHABLE) -> list[tuple[str, dict]]:
    """(kernels method, its options) for each method an accel configuration runs: ``method`` with
    ``options``, then a different ``loss_method`` (when the loss is patched) with none."""
    out = [(method, dict(options or {}))]
    if loss_method is not None and loss_method != method and "loss" in list(patch):
        out.append((loss_method, {}))
    return out


DEFAULT_PATCH = patch_words(PATCHABLE)  # what an accel config patches unless it says otherwise


class ConfigError(ValueError):
    """A config value out of range: the message names the key, the bad value and what is accepted."""


def _bad(key: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"config value {key}={value!r} is not accepted: {accepted}")


def validate(cfg: DictConfig | TrainConfig) -> None:
    """Range checks that the type system cannot express. Raises ConfigError on the first bad value."""
    c = cfg
    positive = {
        "model.n_layer": c.model.n_layer,
        "model.n_head": c.model.n_head,
        "model.n_embd": c.model.n_embd,
        "model.context": c.model.context,
        "data.batch_size": c.data.batch_size,
        "trainer.max_steps": c.trainer.max_steps,
        "trainer.window": c.trainer.window,
        "trainer.val_batches": c.trainer.val_batches,
    }
    for key, v in positive.items():
        if v < 1:
            raise _bad(key, v, "an integer >= 1")
    for key, v in {
        "trainer.warmup_steps": c.trainer.warmup_steps,
        "trainer.val_every": c.trainer.val_every,
        "trainer.ckpt_every": c.trainer.ckpt_every,
        "trainer.lr_warmup_steps": c.trainer.lr_warmup_steps,
    }.items():
        if v < 0:
            raise _bad(key, v, "an integer >= 0")
    if c.model.n_embd % c.model.n_head:
        raise _bad("model.n_embd", c.model.n_embd, f"a multiple of model.n_head ({c.model.n_head})")
    if not 0.0 <= c.model.dropout < 1.0:
        raise _bad("model.dropout", c.model.dropout, "a float in [0, 1)")
    if c.model.vocab_size is not None and c.model.vocab_size < 2:
        raise _bad("model.vocab_size", c.model.vocab_size, "null (the data's vocabulary) or >= 2")
    if c.trainer.lr <= 0:
        raise _bad("trainer.lr", c.trainer.lr, "a float > 0")
    if c.trainer.lr_decay_steps is not None and c.trainer.lr_decay_steps < 1:
        raise _bad("trainer.lr_decay_steps", c.trainer.lr_decay_steps, "null (trainer.max_steps) or an integer >= 1")
    if c.trainer.warmup_steps >= c.trainer.max_steps:
        raise _bad(
            "trainer.warmup_steps",
            c.trainer.warmup_steps,
            f"fewer than trainer.max_steps ({c.trainer.max_steps}), so that some steps are measured",
        )
    for key in ("val_every", "ckpt_every"):
        v = getattr(c.trainer, key)
        if v and v % c.trainer.window:
            raise _bad(
                f"trainer.{key}",
                v,
                f"0 or a multiple of trainer.window ({c.trainer.window}), so that it never falls inside "
                "a throughput window",
            )
    for part in c.accel.patch:
        if part not in PATCHABLE:
            raise _bad("accel.patch", list(c.accel.patch), f"a list of {', '.join(PATCHABLE)} (the softmaxes to patch)")
    if c.accel.loss_form not in LOSS_FORMS:
        raise _bad("accel.loss_form", c.accel.loss_form, f"one of {', '.join(LOSS_FORMS)}")
    if c.accel.get("model_patch") is not None and c.model.family != "hf":
        raise _bad("accel.model_patch", c.accel.model_patch, f"null with model.family={c.model.family}: a whole-model "
                   "patch applies to a Hugging Face model (model=hf_*)")
    if c.data.name not in DATA_KINDS:
        raise _bad("data.name", c.data.name, f"one of {', '.join(DATA_KINDS)}")
    if c.data.name == "text" and not c.data.path:
        raise _bad("data.path", c.data.path, "the path of a text file (data=text data.path=/my/file.txt)")
    if c.data.name == "synthetic" and (c.data.vocab_size is None or c.data.vocab_size < 2):
        raise _bad("data.vocab_size", c.data.vocab_size, "an integer >= 2 for synthetic tokens")
    if not 0.0 < c.data.val_fraction < 0.5:
        raise _bad("data.val_fraction", c.data.val_fraction, "a float in (0, 0.5)")
    if c.data.seq_len is not None:
        if c.data.seq_len < 1:
            raise _bad("data.seq_len", c.data.seq_len, "null (the model's context) or an integer >= 1")
        if c.data.seq_len > c.model.context:
            raise _bad(
                "data.seq_len",
                c.data.seq_len,
                f"at most model.context ({c.model.context}), the longest context the model supports",
            )
    if c.logger.name not in LOGGER_KINDS:
        raise _bad("logger.name", c.logger.name, f"one of {', '.join(LOGGER_KINDS)}")
    if c.logger.mode not in LOGGER_MODES:
        raise _bad("logger.mode", c.logger.mode, f"one of {', '.join(LOGGER_MODES)}")
    if c.trainer.on_nonfinite not in ("stop", "warn"):
        raise _bad("trainer.on_nonfinite", c.trainer.on_nonfinite, "stop or warn")
    if c.compile_mode not in COMPILE_MODES:
        raise _bad("compile_mode", c.compile_mode, f"one of {', '.join(COMPILE_MODES)} (torch.compile's modes)")
    if str(c.trainer.precision) not in PRECISIONS:
        raise _bad("trainer.precision", c.trainer.precision, f"one of {', '.join(PRECISIONS)}")
    for problem in (model_problem(c), tokenizer_problem(c)):  # the model family's keys, data.tokenizer
        if problem:
            raise _bad(*problem)
    offline_only = online_without_key_message(c.logger)
    if offline_only:
        raise ConfigError(offline_only)


def group_options(group: str, conf_dir: Optional[str] = None) -> list[str]:
    """The options of a config group: the YAML files in ``conf/<group>/``, sorted."""
    return sorted(p.stem for p in (Path(conf_dir or CONF_DIR) / group).glob("*.yaml"))


def accel_names() -> list[str]:
    """The accel configurations (conf/accel/*.yaml)."""
    return group_options("accel")


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # type: ignore[return-value]


#: config prefix of each schema dataclass (for field_comments)
_PREFIXES = {"AccelConfig": "accel", "HFModelConfig": "model.hf", "ModelConfig": "model", "DataConfig": "data", "TrainerConfig": "trainer",
             "LoggerConfig": "logger", "TrainConfig": "", "StudyConfig": "study"}


def field_comments() -> dict[str, str]:
    """dotted key -> the comment beside its field in this module (the meaning ``--help`` shows)."""
    out: dict[str, str] = {}
    prefix: Optional[str] = None
    for line in Path(__file__).read_text().splitlines():
        cls = re.match(r"class (\w+)\b", line)
        if cls:
            prefix = _PREFIXES.get(cls.group(1))
            continue
        m = re.match(r"    (\w+): [^#]+#\s*(.*)$", line)
        if m and prefix is not None:
            out[f"{prefix}.{m.group(1)}" if prefix else m.group(1)] = m.group(2).strip()
    return out
