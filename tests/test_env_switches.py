"""What a result records of the process that made it: the HARNESS_* switches set (kernel paths such as the Gluon
kernels' grouped heads), in ``harness.env.environment()`` and in the headers of the tables and reports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.env import environment, switches_text


def test_environment_records_the_harness_switches_set(monkeypatch):
    monkeypatch.delenv("HARNESS_TRITON_DIRECT", raising=False)
    monkeypatch.setenv("HARNESS_FLASH_GLUON_GROUPED", "1")
    monkeypatch.setenv("NOT_A_HARNESS_SWITCH", "x")
    env = environment()
    assert env["switches"].get("HARNESS_FLASH_GLUON_GROUPED") == "1"
    assert "NOT_A_HARNESS_SWITCH" not in env["switches"]
    assert "HARNESS_FLASH_GLUON_GROUPED=1" in switches_text(env)
    assert switches_text({"switches": {}}) == "" and switches_text({}) == ""


def test_the_gluon_grouped_switch_is_read_at_import():
    """HARNESS_FLASH_GLUON_GROUPED=1 turns ``gluon_common.GROUPED`` on for the process (read at import); unset or 0
    it stays off (the grouped path awaits its GPU check); another value is refused saying what is accepted."""
    from kernels.methods.flash import gluon_common

    assert gluon_common.grouped_switch({}) is False
    assert gluon_common.grouped_switch({"HARNESS_FLASH_GLUON_GROUPED": "0"}) is False
    assert gluon_common.grouped_switch({"HARNESS_FLASH_GLUON_GROUPED": "1"}) is True
    with pytest.raises(ValueError, match="1 .* or 0"):
        gluon_common.grouped_switch({"HARNESS_FLASH_GLUON_GROUPED": "yes"})
    env = {**os.environ, "HARNESS_FLASH_GLUON_GROUPED": "1"}
    code = "from kernels.methods.flash import gluon_common; print(gluon_common.GROUPED)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True", run.stdout
