"""The Hydra app end to end on the CPU: composes, trains the tiny model, writes results and W&B runs,
rejects bad overrides with clear messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.config import ConfigError, validate
from harness.config import CONF_DIR
from harness.training import run_training

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["model=tiny", "trainer=cpu", "trainer.max_steps=20", "trainer.val_every=10"]


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(*args, cwd=None, timeout=600, module="harness.train"):
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd or ROOT, env=_cli_env(),
        capture_output=True, text=True, timeout=timeout,
    )


def run_clis(*calls, cwd=None, timeout=600, module="harness.train") -> list[subprocess.CompletedProcess]:
    """Several command lines at once, each a list of arguments (a refusal is mostly Python's start-up and
    imports: two cores run two of them in the time of one)."""
    procs = [subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd or ROOT, env=_cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args in calls]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_train_writes_results_and_offline_wandb_run(tmp_path):
    cfg = compose_cfg(*QUICK, "accel=naive")
    res = run_training(cfg, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["status"] == "completed" and saved["method"] == "naive" and saved["device"] == "CPU"
    assert saved["measured_steps"] == 20 - cfg.trainer.warmup_steps
    assert saved["tokens_per_s"] > 0 and saved["step_ms_p90"] >= saved["step_ms_p50"] > 0
    assert saved["warmup_s"] > 0 and saved["final_val_loss"] is not None
    assert len(saved["loss_curve"]) == 20
    assert saved["env"]["torch"] and "git_revision" in saved["env"]
    assert res["wandb"]["mode"] == "offline"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


def test_training_makes_the_loss_fall(tmp_path):
    cfg = compose_cfg("model=tiny", "trainer=cpu", "trainer.max_steps=60", "trainer.val_every=0", "logger=none")
    res = run_training(cfg, tmp_path)
    curve = res["loss_curve"]
    assert sum(curve[-5:]) / 5 < 0.8 * sum(curve[:5]) / 5


def test_same_seed_same_losses_and_methods_agree(tmp_path):
    a = run_training(compose_cfg(*QUICK, "logger=none", "accel=torch"), tmp_path / "a")
    b = run_training(compose_cfg(*QUICK, "logger=none", "accel=torch"), tmp_path / "b")
    c = run_training(compose_cfg(*QUICK, "logger=none", "accel=naive"), tmp_path / "c")
    assert a["loss_curve"] == b["loss_curve"]
    assert max(abs(x - y) for x, y in zip(a["loss_curve"], c["loss_curve"])) < 1e-3


def test_no_metric_becomes_a_python_number_every_step(tmp_path, monkeypatch):
    """Lightning turns every metric logged with prog_bar=True into a Python number after every batch (on a GPU
    a host-device sync each step); the harness logs none that way, and its bar still shows the loss and the
    throughput, read from callback_metrics when it refreshes."""
    from lightning.pytorch.trainer.connectors.logger_connector import result

    from harness import progress

    converted, shown = [], []
    real_convert, real_bar = result.convert_tensors_to_scalars, progress.bar_metrics
    monkeypatch.setattr(result, "convert_tensors_to_scalars", lambda v: (converted.append(v), real_convert(v))[1])
    monkeypatch.setattr(progress, "bar_metrics", lambda m: (shown.append(real_bar(m)), shown[-1])[1])
    run_training(compose_cfg(*QUICK, "logger=none"), tmp_path)
    assert converted == []
    assert any("loss" in b and "tok/s" in b for b in shown), shown


def test_csv_logger(tmp_path):
    run_training(compose_cfg(*QUICK, "logger=csv"), tmp_path)
    text = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "train/tokens_per_s" in text and "train/loss" in text


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.max_steps=-3", "trainer.max_steps=-3"),
        ("data.batch_size=0", "data.batch_size=0"),
        ("data.seq_len=4096", "at most model.context"),
        ("trainer.val_every=7", "multiple of trainer.window"),
    ],
)
def test_out_of_range_values_are_rejected_by_validate(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(*QUICK, override))


def test_cli_rejects_bad_overrides_before_any_work(tmp_path):
    key, accel, typed, ranged = run_clis(["trainer.max_stepz=3"], ["accel=fastest"], ["trainer.max_steps=abc"],
                                         ["model=tiny", "trainer.max_steps=0"], cwd=tmp_path)
    assert key.returncode == 2 and "unknown config key 'trainer.max_stepz'" in key.stderr and "max_steps" in key.stderr
    assert accel.returncode != 0 and "accel/fastest" in accel.stderr and "triton" in accel.stderr
    assert typed.returncode != 0 and "max_steps" in typed.stderr
    assert ranged.returncode == 2 and "trainer.max_steps=0" in ranged.stderr
    assert not (tmp_path / "outputs").exists()  # nothing half-written


def test_cli_help_lists_groups_and_options():
    r = run_cli("--help")
    assert r.returncode == 0
    for word in ("accel", "model", "data", "trainer", "logger", "triton", "gpt2s", "synthetic"):
        assert word in r.stdout


@pytest.mark.slow  # a subprocess (~6 s); test_cli checks the same refusal in-process
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU-only behaviour")
def test_gpu_only_method_fails_clearly_on_cpu(tmp_path):
    r = run_cli("model=tiny", "trainer=cpu", "accel=cuda", "logger=none", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode != 0 and "cannot run here" in r.stderr and "naive" in r.stderr


def test_cli_end_to_end_and_multirun(tmp_path):
    r = run_cli("-m", *QUICK, "logger=csv", "accel=naive,torch", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    results = sorted((tmp_path / "sweep").glob("*/results.json"))
    assert [json.loads(p.read_text())["method"] for p in results] == ["naive", "torch"]
    assert "accel=torch" in r.stderr or "accel=torch" in r.stdout


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert "SlurmLauncher" in cfg.hydra.launcher._target_ and cfg.hydra.launcher.gpus_per_node == 1


def test_wandb_sweep_file_drives_this_entry_point(monkeypatch):
    import yaml

    # a W&B agent runs logged in: the sweep's logger.mode=online is refused without a key
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)

    sweep = yaml.safe_load((ROOT / "scripts" / "wandb_sweep.yaml").read_text())
    assert sweep["command"][2:4] == ["-m", "harness.train"] and "${args_no_hyphens}" in sweep["command"]
    cfg = compose_cfg(*[f"{k}={v['values'][0] if 'values' in v else v['value']}"
                        for k, v in sweep["parameters"].items()])
    validate(cfg)  # every swept key is a real config key with an accepted value


@pytest.mark.slow  # two ranks in their own processes (~12 s)
def test_ddp_two_processes_on_gloo(tmp_path):
    r = run_cli("model=tiny", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=12",
                "trainer.window=3", "trainer.warmup_steps=2", "trainer.val_every=0", "trainer.val_batches=1",
                "logger=csv", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["world_size"] == 2 and res["status"] == "completed"
    sums = res["rank_first_batch_checksums"]
    assert len(sums) == 2 and sums[0] != sums[1]  # the ranks trained on different batches
    # the global throughput of each window is the sum of the ranks' own figures
    for total, per_rank in zip(res["window_tokens_per_s"], res["window_rank_tokens_per_s"]):
        assert len(per_rank) == 2 and abs(total - sum(per_rank)) < 1e-6 * total
    assert abs(res["tokens_per_s_per_device"] * 2 - res["tokens_per_s"]) < 1e-6 * res["tokens_per_s"]
    assert r.stderr.count("harness: done") == 1  # rank 0 alone reports


@pytest.mark.slow  # a multirun of DDP jobs (~70 s); test_ddp_two_processes_on_gloo stays in the default set
def test_multirun_with_ddp_keeps_jobs_apart_with_one_wandb_run_each(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("-m", "model=tiny", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                "trainer.max_steps=6", "trainer.window=3", "trainer.warmup_steps=1", "trainer.val_every=0",
                "trainer.val_batches=1", "logger=wandb", "accel=naive,torch", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.parent for p in sweep.glob("*/results.json"))
    assert [p.name for p in jobs] == ["0_naive_tiny", "1_torch_tiny"]
    ids = set()
    for job in jobs:
        res = json.loads((job / "results.json").read_text())
        assert res["status"] == "completed" and res["world_size"] == 2
        assert res["config"]["logger"]["group"] == sweep.name
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1 and res["wandb"]["id"] in runs[0].name
        ids.add(res["wandb"]["id"])
    assert len(ids) == 2
