"""`respawn-agent run` configuration: flags, environment fallbacks, refusals that say how to fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from respawn.agent.__main__ import build_parser
from respawn.agent.config import ConfigError, config_from_args


def parse(*argv):
    return config_from_args(build_parser().parse_args(["run", *argv]))


def token_file(tmp_path, mode=0o600, text="rsp_boot_secret"):
    path = tmp_path / "bootstrap-token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_flags_rendered_by_the_provider_user_data_are_enough(tmp_path):
    config = parse("--control-plane-url", "https://cp.example", "--bootstrap-token-file", token_file(tmp_path), "--provider", "aws", "--work-dir", str(tmp_path / "w"))
    assert config.bootstrap_token == "rsp_boot_secret"
    assert config.metadata_url == "http://169.254.169.254" and config.notice_poll_s == 5.0


def test_everything_can_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_CONTROL_PLANE_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("RESPAWN_BOOTSTRAP_TOKEN", "rsp_boot_env")
    monkeypatch.setenv("RESPAWN_PROVIDER", "local")
    monkeypatch.setenv("RESPAWN_METADATA_URL", "http://127.0.0.1:9999")
    monkeypatch.setenv("RESPAWN_WORK_DIR", str(tmp_path))
    monkeypatch.setenv("RESPAWN_HEARTBEAT_INTERVAL_S", "0.25")
    config = parse()
    assert (config.bootstrap_token, config.provider, config.metadata_url, config.heartbeat_interval_s) == ("rsp_boot_env", "local", "http://127.0.0.1:9999", 0.25)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    path = token_file(tmp_path, mode)
    with pytest.raises(ConfigError, match=f"chmod 600 {path}"):
        parse("--control-plane-url", "https://cp", "--bootstrap-token-file", path, "--provider", "aws", "--work-dir", str(tmp_path))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--provider", "ibm"], "provider 'ibm' is not one of aws, gcp, azure, local"),
        (["--provider", "local"], "the local provider has no default"),
        (["--provider", "aws", "--heartbeat-interval-s", "0"], "heartbeat_interval_s must be > 0"),
    ],
)
def test_bad_settings_name_what_is_wrong(tmp_path, argv, message):
    with pytest.raises(ConfigError, match=message):
        parse("--control-plane-url", "https://cp", "--bootstrap-token-file", token_file(tmp_path), "--work-dir", str(tmp_path), *argv)


def test_the_console_script_exits_2_with_the_reason(tmp_path):
    result = subprocess.run([sys.executable, "-m", "respawn.agent", "run", "--control-plane-url", "cp.example", "--provider", "aws", "--work-dir", str(tmp_path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "RESPAWN_BOOTSTRAP_TOKEN": "x"}, timeout=60)
    assert result.returncode == 2 and "must start with http:// or https://" in result.stderr
