"""How the report over a runs folder (harness.study.from_runs) names its groups of comparable runs: by
what differs between them, in a short label (``n_layer=4, lr=0.001``; past MAX_LABEL characters
``group 2: n_layer=4 (+5 more)``), with every group's full settings in one table that each group's
heading links to. Runs that stopped before recording settings that place them (harness.study.collect)
are named as such, never by a row of unknown values.
"""

from __future__ import annotations

import json
from typing import Any

from harness.study.collect import UNPLACED

#: the longest group label before it is cut to its first settings and a count of the rest
MAX_LABEL = 48
#: the table of every group's settings, and the anchor the headings link to
SETTINGS_HEADING = "Settings of each group"
SETTINGS_ANCHOR = "settings-of-each-group"
UNPLACED_LABEL = "runs that stopped before recording their settings"


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _names(differing: list[str]) -> dict[str, str]:
    """Each differing setting's short name (its last part), the full key where two would share one."""
    last = [k.split(".")[-1] for k in differing]
    return {k: s if last.count(s) == 1 else k for k, s in zip(differing, last)}


def short_labels(settings_of: dict, differing: list[str]) -> dict[tuple, str]:
    """Group key -> its label: what differs, in its value here; unique across the groups."""
    names = _names(differing)
    labels: dict[tuple, str] = {}
    for i, (key, st) in enumerate(settings_of.items(), 1):
        if key == UNPLACED:
            labels[key] = UNPLACED_LABEL
            continue
        parts = [f"{names[k]}={_text(st.get(k))}" for k in differing]
        text = ", ".join(parts)
        if not text or len(text) > MAX_LABEL:
            head = f"group {i}"
            kept: list[str] = []
            for part in parts:
                if len(", ".join(kept + [part])) > MAX_LABEL - len(head) - 12:
                    break
                kept.append(part)
            more = f" (+{len(parts) - len(kept)} more)" if len(parts) > len(kept) else ""
            text = head + (": " + ", ".join(kept) if kept else "") + more
        labels[key] = text
    for key, text in list(labels.items()):  # equal labels (values that print alike): numbered
        if list(labels.values()).count(text) > 1:
            labels[key] = f"{text} (group {list(settings_of).index(key) + 1})"
    return labels


def settings_lines(settings_of: dict, differing: list[str], labels: dict) -> list[str]:
    """The table of every group's settings (those that change a loss curve), the differing ones first
    and in bold; empty for a single group."""
    keys = [k for k in settings_of if k != UNPLACED]
    if len(keys) < 2:
        return []
    every = list(dict.fromkeys(differing + sorted({s for k in keys for s in settings_of[k]})))
    lines = ["", f"## {SETTINGS_HEADING}", "",
             "What changes a loss curve, per group (bold: the settings the groups differ in).", "",
             "| setting | " + " | ".join(labels[k].replace("|", "/") for k in keys) + " |",
             "|" + "---|" * (len(keys) + 1)]
    for s in every:
        name = f"**{s}**" if s in differing else s
        lines.append(f"| {name} | " + " | ".join(_text(settings_of[k].get(s)).replace("|", "/") for k in keys) + " |")
    return lines
