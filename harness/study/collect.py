"""The runs under a directory, and which of them can be compared: every ``results.json`` (with its
``parity_probe.json`` when a study wrote one) and every ``study.json``, read; runs grouped by everything
that changes a loss curve (the same model, data (all but the batch order's seed), steps, learning-rate
schedule, optimizer, precision, world size and seed); groups that differ only in the sequence length
(or only in the model) are the points of a sweep. harness.study.from_runs makes the report of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

#: what changes a loss curve, beyond the model and the data (trainer keys)
TRAINER_KEYS = ("max_steps", "lr", "min_lr_ratio", "lr_warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip")
#: data keys that do not change the curve (the batch order's seed is handled apart)
DATA_IGNORED = ("cache_dir", "seed")


def collect(root: Path) -> list[dict]:
    """Every results.json under ``root``, read (an unreadable one as a crashed run), with where it is now
    (``run_dir``), where it ran (``_recorded_run_dir``) and its probe curve (``_probe_curve``)."""
    found = []
    for path in sorted(Path(root).rglob("results.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            found.append({"status": "crashed", "error": f"unreadable {path}: {exc}", "method": path.parent.name,
                          "run_dir": str(path.parent)})
            continue
        res["_recorded_run_dir"] = res.get("run_dir")  # where it ran (a study.json row names it so)
        res["run_dir"] = str(path.parent)  # where it is now (a copied study keeps its layout)
        probe = path.parent / "parity_probe.json"
        if probe.exists():
            try:
                saved = json.loads(probe.read_text())
            except (OSError, json.JSONDecodeError):
                saved = {}
            res["_probe_curve"] = saved.get("curve") or []
            res.setdefault("calibration_ms", saved.get("calibration_ms"))  # the study's (harness.study.drift)
        found.append(res)
    return found


def curve_settings(res: dict) -> dict:
    """Everything in a run that changes its loss curve (but the batch order's seed), flattened."""
    cfg = res.get("config") or {}
    out: dict[str, Any] = {}
    for k, v in sorted((res.get("model") or cfg.get("model") or {}).items()):
        if k != "name":
            out[f"model.{k}"] = v
    for k, v in sorted((res.get("data") or cfg.get("data") or {}).items()):
        if k not in DATA_IGNORED:
            out[f"data.{k}"] = v
    trainer = cfg.get("trainer") or {}
    for k in TRAINER_KEYS:
        out[f"trainer.{k}"] = trainer.get(k)
    out["precision"] = res.get("precision") or cfg.get("precision_resolved")
    out["world_size"] = res.get("world_size") or _planned_world_size(cfg)
    out["seed"] = res.get("seed", cfg.get("seed"))
    return out


def _planned_world_size(cfg: dict) -> Optional[int]:
    """The processes a run was configured for (devices x nodes, where both are numbers): the world size
    of a run that stopped before it recorded its own (an OOM, a crash before training)."""
    t = cfg.get("trainer") or {}
    devices, nodes = t.get("devices"), t.get("num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else None


def group_key(res: dict) -> tuple:
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in curve_settings(res).items()))


def data_seed(res: dict) -> Optional[int]:
    """The effective seed of the run's batch order."""
    d = res.get("data") or (res.get("config") or {}).get("data") or {}
    s = d.get("seed")
    return res.get("seed", (res.get("config") or {}).get("seed")) if s is None else s


def context_of(settings: dict) -> Optional[int]:
    return settings.get("data.seq_len") or settings.get("model.context")


def sweep_kind(differing: list[str], groups: dict) -> Optional[str]:
    """'context' when the groups differ only in the sequence length (and the batch), 'model' when only
    in the model's shape (and the batch), as a study's sweeps do; else None."""
    if len(groups) < 2 or not differing:
        return None
    if set(differing) <= {"model.context", "data.seq_len", "data.batch_size"}:
        return "context"
    if all(k.startswith("model.") or k == "data.batch_size" for k in differing):
        names = {(g[0].get("model") or {}).get("name") for g in groups.values()}
        return "model" if len(names) == len(groups) else None
    return None


def study_files(root: Path) -> list[tuple[Path, dict]]:
    """Every readable study.json under root: (its directory, its contents)."""
    out = []
    for path in sorted(Path(root).rglob("study.json")):
        try:
            out.append((path.parent, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def study_rows(studies: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """Every row of the studies: (study dir, row)."""
    return [(d, r) for d, data in studies for r in data.get("rows") or []]


def study_settings(root: Path, studies: list[tuple[Path, dict]]) -> dict:
    """The study keys (reference, baseline, parity settings) of the first study under root: its study.json,
    else the ``study`` of a Hydra config saved beside runs (``.hydra/config.yaml``); {} when none."""
    for _, data in studies:
        if (data.get("config") or {}).get("study"):
            return data["config"]["study"]
    for path in sorted(Path(root).rglob(".hydra/config.yaml")):
        try:
            study = OmegaConf.to_container(OmegaConf.load(path)).get("study")
        except Exception:  # an unreadable config: no settings from it
            continue
        if isinstance(study, dict):
            return study
    return {}


#: the environment keys the report's header names
ENV_KEYS = ("device_name", "torch", "triton", "git_revision")


def runs_environment(runs: list[dict], studies: list[tuple[Path, dict]]) -> dict:
    """The environment the runs ran in (each results.json records it), not this machine's: a value the
    runs disagree on lists each ('NVIDIA H200 / NVIDIA A100'); from the studies' study.json where no
    run recorded one; 'not recorded' where neither did."""
    envs = [r.get("env") or (r.get("config") or {}).get("env") for r in runs]
    envs = [e for e in envs if isinstance(e, dict)] or [d["env"] for _, d in studies if isinstance(d.get("env"), dict)]
    out: dict[str, Any] = {k: "not recorded" for k in ENV_KEYS}
    for key in dict.fromkeys(k for e in envs for k in e):
        values = list(dict.fromkeys(json.dumps(e[key]) for e in envs if e.get(key) is not None))
        if values:
            out[key] = json.loads(values[0]) if len(values) == 1 else " / ".join(str(json.loads(v)) for v in values)
    return out


@dataclass
class Groups:
    """Runs in groups of comparable runs (harness.study.from_runs makes each a point of the report)."""

    members: dict  # group key -> its runs, in report order
    settings: dict  # group key -> curve_settings of its first run
    differing: list  # the settings the groups differ in
    sweep: Optional[str]  # 'context' | 'model' when the groups are the points of such a sweep


#: the group of runs that stopped before recording settings that match one group (harness.report
#: lists them apart instead of inventing a group of unknown values)
UNPLACED = (("_unplaced", "true"),)


def finished_record(res: dict) -> bool:
    """Whether the run wrote its final record (harness.results.final_record): one that stopped before
    it (a crash, a record left 'running') lacks what only training records (world size, precision)."""
    return bool(res.get("config")) and "world_size" in res


def comparable_groups(runs: list[dict]) -> Groups:
    """The runs grouped by what changes their loss curves; a run that stopped before it recorded every
    setting joins the one group its recorded settings match (its siblings, the runs in the same
    directory, break a tie), else it is UNPLACED; a context sweep's groups in order of T."""
    groups: dict[tuple, list[dict]] = {}
    finished = [r for r in runs if finished_record(r)]
    for res in finished:
        groups.setdefault(group_key(res), []).append(res)
    full = list(groups)  # the groups of runs that recorded every setting
    for res in runs:
        if not finished_record(res):
            groups.setdefault(_place(res, groups, full), []).append(res)
    settings_of = {key: ({} if key == UNPLACED else curve_settings(members[0])) for key, members in groups.items()}
    differing = _differing(settings_of, set(full))
    placed = {k: v for k, v in groups.items() if k != UNPLACED}
    sweep = sweep_kind(differing, placed)
    if sweep == "context":  # groups in order of T, labelled as a study's sweep points
        groups = dict(sorted(groups.items(), key=lambda kv: (context_of(settings_of[kv[0]]) is None,
                                                             context_of(settings_of[kv[0]]) or 0)))
    return Groups(groups, settings_of, differing, sweep)


def _place(res: dict, groups: dict, full: list) -> tuple:
    """The group of a run that stopped before its final record: the one finished group that agrees with
    every setting it did record (None: not recorded), its siblings' when several do; its own group
    when none does (it ran something else) or when no run finished; else UNPLACED."""
    known = {k: json.dumps(v, sort_keys=True) for k, v in curve_settings(res).items() if v is not None} \
        if res.get("config") else {}
    matches = [key for key in full if all(dict(key).get(k) == v for k, v in known.items())]
    if len(matches) > 1:
        parent = Path(res.get("run_dir", "")).parent
        near = [key for key in matches if any(Path(r.get("run_dir", "")).parent == parent for r in groups[key])]
        matches = near if len(near) == 1 else matches
    if len(matches) == 1:
        return matches[0]
    if res.get("config") and (not matches or not full):
        return group_key(res)
    return UNPLACED


def _differing(settings_of: dict, full: set) -> list[str]:
    """The settings the groups differ in; a group of stopped runs only (not in ``full``) counts only its
    recorded values (a None there is unknown, not a difference)."""
    values: dict[str, set] = {}
    for key, st in settings_of.items():
        for k, v in st.items():
            if v is not None or key in full:
                values.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return sorted(k for k, vs in values.items() if len(vs) > 1)
