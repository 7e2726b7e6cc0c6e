"""W&B online without an API key: refused before any work (exit 2, one paragraph saying how to log in
or go offline), for a training run and a study alike; the key found where wandb finds it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.cli import precheck_overrides
from harness.config import CONF_DIR
from harness.study.checks import validate_study
from harness.train import validate_with_data
from harness.wandb_auth import online_without_key_message, wandb_key_configured, wandb_mode


@pytest.fixture
def no_key(tmp_path, monkeypatch):
    """No WANDB_API_KEY, an empty netrc, no WANDB_MODE or base URL of the user's."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def _logger(mode: str, name: str = "wandb"):
    return OmegaConf.create({"name": name, "mode": mode})


def test_the_key_is_found_in_the_environment_or_the_netrc_entry_of_the_wandb_host(no_key, monkeypatch):
    assert not wandb_key_configured()
    no_key.write_text("machine example.com login user password secret\n")
    assert not wandb_key_configured()  # another host's entry is no W&B key
    no_key.write_text("machine api.wandb.ai login user password k" + "0" * 39 + "\n")
    assert wandb_key_configured()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.mycompany.com")
    assert not wandb_key_configured()  # the key belongs to the server wandb would talk to
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert wandb_key_configured()


def test_online_without_a_key_is_refused_and_auto_falls_back_to_offline(no_key, monkeypatch):
    msg = online_without_key_message(_logger("online"))
    assert msg and "wandb login" in msg and "WANDB_API_KEY" in msg and "logger.mode=offline" in msg
    assert wandb_mode("auto") == "offline" and online_without_key_message(_logger("auto")) is None
    assert online_without_key_message(_logger("offline")) is None
    assert online_without_key_message(_logger("online", name="csv")) is None  # no W&B in that run
    monkeypatch.setenv("WANDB_MODE", "online")  # auto obeys WANDB_MODE: the same refusal, naming it
    assert "WANDB_MODE=online" in online_without_key_message(_logger("auto"))
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert online_without_key_message(_logger("online")) is None


@pytest.mark.parametrize("config,validate", [("config", validate_with_data), ("study", validate_study)],
                         ids=["train", "study"])
def test_command_line_refuses_online_without_a_key_before_any_directory(no_key, tmp_path, monkeypatch, capsys,
                                                                        config, validate):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:
        precheck_overrides(["model=tiny", "logger.mode=online"], CONF_DIR, config, validate=validate)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "logger.mode=online needs a W&B API key" in err and "wandb login" in err and "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before  # nothing created
