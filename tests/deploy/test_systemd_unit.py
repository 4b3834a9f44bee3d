"""The agent bootstrap every provider embeds as user data: a pinned agent under
a systemd unit that restarts it. The unit is verified by systemd-analyze; the
script is run by bash against a scratch root laid out like an image that already
holds the pinned wheel, with a stand-in systemctl (the download and install:
tests/deploy/test_agent_install.py)."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from respawn.agent import EXIT_INSTANCE_ENDED
from respawn_server.jobs.fleet.agent_dist import AgentDist
from respawn_server.jobs.fleet.providers.base import AGENT_BIN, AGENT_MARKER, render_user_data

URL = "https://cp.example.org/base%20path$HOME"
VENV_AGENT = Path(sys.executable).with_name("respawn-agent")


AGENT = AgentDist(version="0.1.0", wheel="respawn_ml-0.1.0-py3-none-any.whl", wheel_sha256="ab" * 32,
                  requirements_sha256="cd" * 32)


def rendered(**overrides) -> str:
    kwargs = dict(control_plane_url=URL, bootstrap_token="rb_boot'tok", provider="aws", agent=AGENT) | overrides
    return render_user_data(**kwargs)


def unit_text(script: str) -> str:
    """What bash writes for the unit: the quoted heredoc, run by bash itself."""
    match = re.search(r"^cat > (\S+) <<'RESPAWN_UNIT'\n.*?^RESPAWN_UNIT$", script, re.S | re.M)
    assert match, "the script writes no unit file"
    return subprocess.run(["bash", "-c", match.group(0).replace(match.group(1), "/dev/stdout", 1)],
                          capture_output=True, text=True, check=True).stdout


def test_user_data_pins_the_wheel_and_never_names_an_index_package():
    script = rendered()
    assert f"respawn_ml-0.1.0-py3-none-any.whl {'ab' * 32} {'cd' * 32}" in script
    assert "respawn[agent]" not in script and "pip install respawn" not in script
    assert '"--no-index", "--no-deps"' in script
    assert "systemctl daemon-reload" in script
    assert "systemctl enable --now respawn-agent.service" in script
    assert "exec respawn-agent" not in script


def test_unit_passes_systemd_analyze_verify(tmp_path):
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: apt-get install systemd"
    unit = unit_text(rendered())
    assert "Restart=on-failure" in unit.splitlines()
    # The agent's exit status for "the control plane ended this instance": not restarted.
    assert f"RestartPreventExitStatus={EXIT_INSTANCE_ENDED}" in unit.splitlines()
    assert "WantedBy=multi-user.target" in unit.splitlines()
    # verify checks the executable exists: point it at this checkout's real agent entry point.
    path = tmp_path / "respawn-agent.service"
    path.write_text(unit.replace(AGENT_BIN, str(VENV_AGENT)))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_verify_would_catch_a_broken_unit(tmp_path):
    path = tmp_path / "broken.service"
    path.write_text(unit_text(rendered()).replace(f'ExecStart="{AGENT_BIN}"', "ExecStart=respawn agent"))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_systemd_sees_the_agent_arguments_literally():
    """% and $ in a URL would be systemd specifiers and variables if not escaped."""
    exec_line = next(line for line in unit_text(rendered()).splitlines() if line.startswith("ExecStart="))
    assert '"https://cp.example.org/base%%20path$$HOME"' in exec_line
    assert '"--provider" "aws"' in exec_line


def test_a_line_break_in_an_argument_is_refused():
    with pytest.raises(ValueError, match="line break"):
        rendered(control_plane_url="https://cp.example.org/\n[Service]\nExecStartPre=/bin/rm")


def scratch_vm(tmp_path):
    """A scratch root laid out like a VM image that holds the pinned wheel (its marker:
    no download, no pip), python3 (this interpreter) and a stand-in systemctl."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    for d in (root / "etc/systemd/system", root / "usr/local/bin", bin_dir):
        d.mkdir(parents=True)
    marker = root / AGENT_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.write_text(AGENT.wheel_sha256 + "\n")
    (bin_dir / "systemctl").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/systemctl.calls\n')
    (bin_dir / "systemctl").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    return root, bin_dir, {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RESPAWN_ROOT": str(root)}


def test_the_script_runs_writes_a_0600_token_and_starts_the_unit(tmp_path):
    root, bin_dir, env = scratch_vm(tmp_path)
    subprocess.run(["bash", "-c", rendered()], env=env, check=True, timeout=60, capture_output=True)

    token = root / "var/lib/respawn/bootstrap-token"
    assert token.read_text() == "rb_boot'tok"
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(root / "var/lib/respawn").st_mode) == 0o700
    wrapper = (root / "usr/local/bin/respawn-agent").read_text()
    assert f"export PYTHONPATH={root}/opt/respawn/lib" in wrapper and f"exec {bin_dir}/python3 -m respawn.agent" in wrapper
    assert "Restart=on-failure" in (root / "etc/systemd/system/respawn-agent.service").read_text()
    assert (tmp_path / "systemctl.calls").read_text().splitlines() == ["daemon-reload", "enable --now respawn-agent.service"]


def test_without_systemd_the_script_becomes_the_units_command(tmp_path):
    """RESPAWN_NO_SYSTEMD (never set by a cloud) execs what ExecStart names, as its
    own process, so a test can play the VM with this very script."""
    root, bin_dir, env = scratch_vm(tmp_path)
    # python3 as the agent's wrapper runs it (`python3 -m respawn.agent ARGS`) shows how it was called.
    (bin_dir / "python3").unlink()
    (bin_dir / "python3").write_text(
        '#!/bin/bash\nif [ "$1 $2" = "-m respawn.agent" ]; then shift 2; printf "%s\\n" "$@"; echo "pid $$ parent $PPID"; '
        f'exit 0; fi\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    script = tmp_path / "user-data"
    script.write_text(rendered())
    script.chmod(0o700)
    run = subprocess.run([str(script)], env={**env, "RESPAWN_NO_SYSTEMD": "1"}, check=True, timeout=60,
                         capture_output=True, text=True)

    *argv, pids = [line for line in run.stdout.splitlines() if not line.startswith("respawn: ")]
    unit_argv = next(line for line in unit_text(rendered()).splitlines() if line.startswith("ExecStart="))
    rooted = [arg.replace("/var/lib/respawn", f"{root}/var/lib/respawn")
              for arg in re.findall(r'"((?:[^"\\]|\\.)*)"', unit_argv)]
    assert rooted[0] == AGENT_BIN
    assert argv == [arg.replace("%%", "%").replace("$$", "$") for arg in rooted[1:]]
    assert not (tmp_path / "systemctl.calls").exists()
    assert pids.split()[3] == str(os.getpid())  # exec'd: the agent took the script's own process


def test_the_agent_gets_the_providers_environment_with_or_without_systemd():
    script = rendered(agent_env={"AZURE_CLIENT_ID": "0f1e$2d%3c"})
    assert 'Environment="AZURE_CLIENT_ID=0f1e$$2d%%3c"' in unit_text(script).splitlines()
    assert "  export AZURE_CLIENT_ID='0f1e$2d%3c'" in script.splitlines()
