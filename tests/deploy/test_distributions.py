"""The two distributions as a user gets them (DESIGN §12): each wheel built from this
checkout, the library's installed into a fresh virtual environment, and what the
README promises checked there.

No network. pip gets the wheels built here and this machine's local package sources
only: the file:// indexes and find-links directories of its pip configuration (where
this machine keeps torch's CPU build and the rest). The configuration itself is then
switched off (PIP_CONFIG_FILE=/dev/null, no PIP_* variables) and those sources passed
by hand, so no remote index is ever asked; a machine whose pip has no local source
skips the test rather than download.

The control plane's wheel is installed too, with both wheels and nothing else of ours, into
a fresh virtual environment that borrows its third-party dependencies from the one running
this test (the one `make install` made): some of them (Django REST framework, the Azure
SDKs) are not on every machine's local index. Its requirements are checked against those."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import respawn

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = "respawn-ml"
SERVER = "respawn-server"
NOT_IN_THE_LIBRARY = ("django", "rest_framework", "celery", "boto3", "botocore", "google.cloud", "azure",
                      "respawn_server")
# The folders the server is built from, which must not be import names of their own.
SERVER_FOLDERS = ("jobs", "frontend", "controlplane")
# Modules that need an extra (each names it in its docstring); everything else of
# `respawn` imports in the base install.
NEED_AN_EXTRA = ("respawn.integrations.hf", "respawn.integrations.lightning", "respawn.integrations.accelerate",
                 "respawn.integrations.jax", "respawn.checkpoint.storage.s3", "respawn.checkpoint.storage.gcs",
                 "respawn.checkpoint.storage.azure", "respawn.examples.hf_trainer",
                 "respawn.examples.lightning_module", "respawn.examples.accelerate_loop", "respawn.examples.jax_flax")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "node_modules")


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def local_sources() -> list[str]:
    """pip options naming this machine's local package sources, from its pip configuration."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    indexes, links = [], []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        for item in value.strip("'\"").split():
            local = item.startswith("file://") or (item.startswith("/") and Path(item).exists())
            target = indexes if key.endswith("index-url") else links if key.endswith("find-links") else None
            if local and target is not None and item not in target:
                target.append(item)
    if not indexes and not links:
        pytest.skip("this machine's pip configuration names no local package source, and tests never download")
    options = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    for index in indexes[1:]:
        options += ["--extra-index-url", index]
    for link in links:
        options += ["--find-links", link]
    return options


def build_wheel(source: Path, out: Path, name: str) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(out), str(source)], check=True, env=pip_env(), timeout=300)
    (built,) = out.glob(f"{name.replace('-', '_')}-*.whl")
    return built


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Each distribution's wheel, built from a copy (a build in place leaves build/ behind)."""
    tmp = tmp_path_factory.mktemp("dists")
    library = tmp / LIBRARY
    shutil.copytree(ROOT / "agents", library, ignore=IGNORE)
    server = tmp / SERVER
    server.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copyfile(ROOT / name, server / name)
    for name in ("jobs", "frontend", "controlplane"):
        shutil.copytree(ROOT / name, server / name, ignore=IGNORE)
    out = tmp / "wheels"
    return {LIBRARY: build_wheel(library, out, LIBRARY), SERVER: build_wheel(server, out, SERVER)}


def wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in names else ""
    return {n.split("/")[0] for n in names}, metadata, entry_points


def requirements(metadata) -> list[Requirement]:
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def test_the_library_wheel_holds_respawn_alone_and_requires_no_server_or_cloud_sdk(wheels):
    top, metadata, entry_points = wheel_metadata(wheels[LIBRARY])
    assert top == {"respawn", f"respawn_ml-{respawn.__version__}.dist-info"}
    assert metadata["Name"] == LIBRARY and metadata["Version"] == respawn.__version__
    assert "respawn-agent = respawn.agent.__main__:main" in entry_points
    assert "respawn = respawn.cli.__main__:main" in entry_points
    base = {r.name.lower() for r in requirements(metadata) if r.marker is None}
    assert base == {"torch", "numpy", "safetensors", "torchdata", "requests", "xxhash", "pyyaml", "pathspec"}
    extras = {}
    for r in requirements(metadata):
        if r.marker is not None:
            extra = str(r.marker).split('"')[1]
            extras.setdefault(extra, set()).add(r.name.lower())
    assert extras == {"hf": {"transformers", "accelerate"}, "accelerate": {"accelerate"}, "lightning": {"lightning"},
                      "jax": {"jax", "flax", "optax", "orbax-checkpoint"}, "s3": {"boto3"},
                      "gcs": {"google-cloud-storage"}, "azure": {"azure-storage-blob", "azure-identity"}}


def test_the_server_wheel_holds_the_server_alone_and_runs_here(wheels):
    top, metadata, _ = wheel_metadata(wheels[SERVER])
    assert top == {"respawn_server", f"respawn_server-{metadata['Version']}.dist-info"}
    assert metadata["Name"] == SERVER
    base = [r for r in requirements(metadata) if r.marker is None]
    (library,) = [r for r in base if r.name == LIBRARY]
    assert str(library.specifier) == f"=={respawn.__version__}" and library.extras == {"s3", "gcs", "azure"}
    # The environment the control plane runs in (this test's) has every one of them.
    unmet = [str(r) for r in base
             if r.name != LIBRARY and importlib.metadata.version(r.name) not in r.specifier]
    assert not unmet
    assert importlib.metadata.version(LIBRARY) == respawn.__version__


CHECK_IMPORTS = textwrap.dedent("""
    import importlib, importlib.util, json, pkgutil, sys
    import respawn
    from respawn.checkpoint import Checkpointer, ResumableLoader
    from respawn import trainer, protocol
    from respawn.agent.__main__ import main as agent_main
    from respawn.cli.__main__ import main as cli_main
    failed = {}
    for module in pkgutil.walk_packages(respawn.__path__, "respawn."):
        if module.name not in NEED_AN_EXTRA and not module.name.endswith("__main__"):
            try:
                importlib.import_module(module.name)
            except Exception as exc:
                failed[module.name] = repr(exc)
    try:
        from respawn.checkpoint.storage import StorageError, open_storage
        open_storage("s3://bucket/prefix")
        s3 = "opened"
    except StorageError as exc:
        s3 = str(exc)
    def findable(name):
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False
    print(json.dumps({"file": respawn.__file__, "failed": failed, "s3": s3,
                      "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("agents", "respawn_server", "jobs", "frontend", "controlplane", "django", "celery", "boto3", "azure") or m.startswith("google.cloud")),
                      "installed": sorted(n for n in NOT_IN_THE_LIBRARY + SERVER_FOLDERS if findable(n))}))
""")


def check_imports(python: Path) -> dict:
    script = (f"NEED_AN_EXTRA = {NEED_AN_EXTRA!r}\nNOT_IN_THE_LIBRARY = {NOT_IN_THE_LIBRARY!r}\n"
              f"SERVER_FOLDERS = {SERVER_FOLDERS!r}\n{CHECK_IMPORTS}")
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=pip_env(), cwd=python.parent,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run(*argv, env=None, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env or pip_env(), timeout=600,
                            **kwargs)
    assert result.returncode == 0, f"{argv}: {result.stdout}\n{result.stderr}"
    return result


def test_the_library_installs_into_a_fresh_venv_lean_and_alone(wheels, tmp_path):
    sources = local_sources()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    bin_dir = venv / "bin"
    # --no-compile: byte-compiling torch and transformers took most of this test's time,
    # and what it checks is what gets installed and imported.
    pip = [bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-compile", *sources, "--find-links",
           wheels[LIBRARY].parent]

    # The base install: the documented imports, every module but the extras', both commands.
    run(*pip, LIBRARY)
    seen = check_imports(bin_dir / "python")
    assert Path(seen["file"]).is_relative_to(venv) and not seen["failed"]
    assert seen["loaded"] == [] and seen["installed"] == []  # no Django, Celery, cloud SDK, server module
    assert "pip install 'respawn-ml[s3]'" in seen["s3"]
    for command in (["respawn-agent", "--help"], ["respawn", "--help"], ["python", "-m", "respawn", "--help"],
                    ["python", "-m", "respawn.agent", "preflight", "--help"]):
        assert "usage:" in run(bin_dir / command[0], *command[1:], cwd=tmp_path).stdout
    assert "No broken requirements" in run(bin_dir / "python", "-m", "pip", "check").stdout

    # A package named `agents` beside it (openai-agents' import name) changes nothing:
    # nothing of ours imports it, and importing it gets that package.
    fake = tmp_path / "agents-dist"
    (fake / "agents").mkdir(parents=True)
    (fake / "agents" / "__init__.py").write_text("WHOSE = 'another project'\n")
    (fake / "agents" / "checkpoint.py").write_text("raise ImportError('not Respawn: another project named agents')\n")
    (fake / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n'
                                         '[project]\nname = "agents"\nversion = "0.0.1"\n')
    run(*pip, build_wheel(fake, tmp_path / "fake-wheel", "agents"))
    assert check_imports(bin_dir / "python") == seen
    assert "usage:" in run(bin_dir / "respawn-agent", "--help", cwd=tmp_path).stdout
    assert run(bin_dir / "python", "-c", "import agents; print(agents.WHOSE)", cwd=tmp_path).stdout.strip() == "another project"

    # An extra brings its framework and nothing of the server.
    run(*pip, f"{LIBRARY}[hf]")
    hf = run(bin_dir / "python", "-c", "import sys\nfrom respawn.integrations.hf import spot_safe\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_IN_THE_LIBRARY!r} or m.startswith('google.cloud')))",
             cwd=tmp_path)
    assert hf.stdout.strip() == "[]"
    assert check_imports(bin_dir / "python")["installed"] == []
    assert "No broken requirements" in run(bin_dir / "python", "-m", "pip", "check").stdout


SERVER_CHECK = textwrap.dedent("""
    import importlib.util, json, os
    os.environ["DJANGO_SETTINGS_MODULE"] = "respawn_server.settings"
    import django
    django.setup()
    from django.apps import apps
    from django.contrib.staticfiles import finders
    from django.template.loader import get_template
    import respawn, respawn_server, respawn_server.jobs.tasks, respawn_server.celery
    print(json.dumps({
        "files": [respawn.__file__, respawn_server.__file__, apps.get_app_config("jobs").path],
        "labels": sorted(c.label for c in apps.get_app_configs() if c.name.startswith("respawn_server")),
        "template": get_template("frontend/jobs.html").origin.name,
        "static": finders.find("frontend/jobs.js"),
        "tasks": sorted(t for t in respawn_server.celery.app.tasks if t.startswith("respawn_server.")),
        "folders": [n for n in ("jobs", "frontend", "controlplane") if importlib.util.find_spec(n)],
    }))
""")


def test_the_server_installs_under_its_own_name_and_serves_from_the_wheel(wheels, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--no-compile", "--no-deps", "--no-index", wheels[LIBRARY], wheels[SERVER])
    # The third-party dependencies this test's environment has, as a plain path: its own
    # .pth files (the editable installs of this checkout) are not read from there.
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    (site / "zz-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {**pip_env(), "RESPAWN_VAR_DIR": str(tmp_path / "var"), "DJANGO_SECRET_KEY": "test-only"}
    seen = json.loads(run(python, "-c", SERVER_CHECK, cwd=tmp_path, env=env).stdout)
    assert all(Path(f).is_relative_to(venv) for f in seen["files"]), seen["files"]
    assert seen["labels"] == ["frontend", "jobs"]  # the tables and migrations keep their names
    assert Path(seen["template"]).is_relative_to(venv) and Path(seen["static"]).is_relative_to(venv)
    assert "respawn_server.jobs.tasks.schedule" in seen["tasks"]
    assert seen["folders"] == []  # no top-level `jobs`, `frontend` or `controlplane`
    assert "Migrations for" not in run(python, "-m", "django", "makemigrations", "--check", "--dry-run",
                                       cwd=tmp_path, env={**env, "DJANGO_SETTINGS_MODULE": "respawn_server.settings"}).stdout
