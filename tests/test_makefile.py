"""`make setup` (behind `make train` and `make test`): a CPU torch without a GPU, PyTorch's CPU index
first and pip's default index when it cannot be reached, and a reinstall when another torch is asked
for. Run with a stand-in python, so nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

FAKE_PYTHON = """#!/bin/sh
# a stand-in python: logs its arguments, fakes venv creation, pip and torch's version
echo "$*" >> "$FAKE_LOG"
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0 ;;
  "-m pip")
    if [ -n "${FAIL_INDEX:-}" ]; then
      case "$*" in *"--index-url $FAIL_INDEX"*) echo "ERROR: could not reach $FAIL_INDEX" >&2; exit 1 ;; esac
    fi
    exit 0 ;;
esac
case "$*" in *"-c import"*) echo "make: installed torch 9.9.9 (fake)"; exit 0 ;; esac
exit 0
"""


@pytest.fixture
def fake_make(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "fake-python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "calls.log"

    def nvidia_smi(works: bool) -> None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nexit {0 if works else 1}\n")
        smi.chmod(0o755)

    def run(*variables: str, env_extra: dict | None = None, target: str = "setup") -> tuple[str, list[str]]:
        before = log.read_text().splitlines() if log.exists() else []
        # the outer make (make test) must not leak its variables into this one
        env = {k: v for k, v in os.environ.items()
               if k not in ("TORCH_SPEC", "TORCH_INDEX", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
        env.update({"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "FAKE_LOG": str(log), **(env_extra or {})})
        r = subprocess.run(["make", "-C", str(ROOT), target, f"PYTHON={python}", f"VENV={tmp_path / 'venv'}",
                            *variables], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        after = log.read_text().splitlines() if log.exists() else []
        return r.stdout + r.stderr, after[len(before):]

    nvidia_smi(False)
    run.nvidia_smi = nvidia_smi
    return run


def test_makefile_installs_a_cpu_torch_without_a_gpu_and_reinstalls_on_a_new_spec(fake_make):
    out, calls = fake_make()
    assert "no GPU here" in out and "installed torch" in out
    assert f"-m pip install -q --retries 1 --timeout 15 --index-url {CPU_INDEX} torch" in calls
    assert any(c.startswith("-m pip install -q -e .[test]") for c in calls)

    out, calls = fake_make()
    assert calls == []  # set up already: nothing is installed again

    out, calls = fake_make("TORCH_SPEC=torch==2.13.0")
    assert "-m pip uninstall -q -y torch" in calls  # pip would keep the other build as "satisfied"
    assert f"-m pip install -q --retries 1 --timeout 15 --index-url {CPU_INDEX} torch==2.13.0" in calls
    assert "reinstalling" in out

    out, calls = fake_make("TORCH_SPEC=torch==2.13.0", "TORCH_INDEX=")  # pip's own configuration (CI)
    assert "-m pip install -q torch==2.13.0" in calls and not any("--index-url" in c for c in calls)


def test_makefile_falls_back_to_the_default_index_and_uses_it_on_a_gpu(fake_make):
    out, calls = fake_make(env_extra={"FAIL_INDEX": CPU_INDEX})
    assert f"{CPU_INDEX} cannot be reached" in out and "pip's default index instead" in out
    assert calls.index("-m pip install -q torch") > calls.index(
        f"-m pip install -q --retries 1 --timeout 15 --index-url {CPU_INDEX} torch")

    fake_make.nvidia_smi(True)
    out, calls = fake_make()
    assert "a GPU is here" in out
    assert "-m pip install -q torch" in calls and not any("--index-url" in c for c in calls)


def test_make_test_leaves_the_slow_tests_to_test_slow_and_test_all_runs_every_one(fake_make):
    fake_make()  # set up once
    _, calls = fake_make(target="test")  # two test processes, a file's tests together (pytest-xdist)
    assert calls == ["-m pytest -q -n 2 --dist loadfile -m not slow"]
    _, calls = fake_make(target="test-slow")
    assert calls == ["-m pytest -q -n 2 --dist loadfile -m slow"]
    _, calls = fake_make(target="test-all")
    assert calls == ["-m pytest -q -n 2 --dist loadfile"]
    _, calls = fake_make("TEST_WORKERS=0", target="test")  # in this process alone
    assert calls == ["-m pytest -q -m not slow"]


def test_ci_runs_the_readmes_test_command():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "time make test" in lines
    assert "make test" in (ROOT / "README.md").read_text()


REPORTING_PYTHON = """#!/bin/sh
# pip: writes the install report pip would (torch from a local wheel); anything else: the real python
case "$1 $2" in
  "-m pip") [ -n "${PIP_REPORT:-}" ] && printf '%s' "$REPORT_JSON" > "$PIP_REPORT"; exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def test_install_torch_names_the_local_wheel_pip_really_took(tmp_path):
    python = tmp_path / "python"
    python.write_text(REPORTING_PYTHON)
    python.chmod(0o755)
    wheel = "/wheels/torch-2.13.0+cpu-cp311-linux_x86_64.whl"
    report = ('{"install": [{"metadata": {"name": "torch"}, "download_info": {"url": "file://' + wheel + '"}}]}')
    stand_in = tmp_path / "site" / "torch"  # a torch stand-in: importing the real one takes seconds
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("__version__ = '2.13.0+cpu'\n\nclass version:\n    cuda = None\n")
    env = {**os.environ, "REAL_PYTHON": sys.executable, "REPORT_JSON": report, "PYTHONPATH": str(stand_in.parent)}
    r = subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh"), str(python), "torch", CPU_INDEX, "w",
                        str(tmp_path / "stamp")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"from a local wheel, {wheel}" in r.stdout and CPU_INDEX not in r.stdout
    # no report (torch already there): pip's own configuration is named, not an index it may not have used
    env["REPORT_JSON"] = "{}"
    r = subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh"), str(python), "torch", "", "w",
                        str(tmp_path / "stamp")], capture_output=True, text=True, env=env, timeout=60)
    assert "from pip's configured indexes/find-links" in r.stdout, r.stdout + r.stderr
