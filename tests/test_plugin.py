"""Adding a method is one module and one config file: in a copy of the tree, a new method module and
its conf/accel file are all it takes for the default study, the benchmark tables and --help to list it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

METHOD = '''"""`doubled`: a throw-away method of the plugin test (a softmax computed twice over)."""
import torch

from kernels.registry import Method, register


def doubled_softmax(scores, scale, causal):
    x = scores.float() * scale
    if causal:
        tq, tk = x.shape[-2], x.shape[-1]
        x = x.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=x.device).triu(tk - tq + 1), float("-inf"))
    return torch.softmax(torch.log(torch.softmax(x, -1)), -1).to(scores.dtype)


register(Method(name="doubled", softmax=doubled_softmax, summary="the plugin test's method"))
'''

PROBE = '''
import json
import harness.study.plan as study
from harness.bench import attention, launch, softmax
from harness.config import CONF_DIR
from harness.help import help_text
import kernels
print(json.dumps({
    "study": study.default_methods(),
    "softmax_table": softmax.default_methods(),
    "attention_table": attention.default_methods(),
    "launch_table": launch.default_methods(),
    "help": help_text("train", CONF_DIR, "config"),
    "kernels": kernels.__file__,
    "conf": CONF_DIR,
}))
'''


def test_one_module_and_one_config_put_a_method_in_every_default_listing(tmp_path):
    tree = tmp_path / "tree"
    for part in ("kernels", "harness", "models", "conf"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "kernels" / "methods" / "doubled.py").write_text(METHOD)
    (tree / "conf" / "accel" / "doubled.yaml").write_text("# the plugin test's method\nname: doubled\nmethod: doubled\n")
    env = dict(os.environ, PYTHONPATH=str(tree))
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(seen["kernels"]).is_relative_to(tree) and Path(seen["conf"]).is_relative_to(tree)  # the copy ran
    assert "doubled" in seen["study"]
    assert "doubled" in seen["softmax_table"] and "doubled" in seen["attention_table"]  # native and composed
    assert "doubled" in seen["launch_table"]
    assert "doubled" in seen["help"]
    # and the unchanged tree does not know it
    assert not (ROOT / "kernels" / "methods" / "doubled.py").exists()
