"""The layout of `jobs/` (its map is jobs/__init__.py): imports point from the core out
to the subsystems and on to the API, tasks and dashboard, never back, and a name says
which file it is within a subsystem. Read from the source with `ast`, function-local
imports included: an import that runs late still ties two modules together."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_TIER = ("respawn_server.jobs.api", "respawn_server.jobs.tasks", "respawn_server.jobs.management", "respawn_server.frontend")
# Modules the simulator and the providers' emulator tests import without Django (the CLI's
# share is in the library, respawn.vocabulary: test_the_library_imports_nothing_of_the_server).
RECOVERY = "respawn_server.jobs.recovery"
REPORTS = "respawn_server.jobs.reports"
# What recovery may use of the fleet: what places a VM. The scheduler, launcher and reconciler
# call recovery (a gang's rendezvous, an instance's end), so recovery calls none of them.
FLEET_UNDER_RECOVERY = ("respawn_server.jobs.fleet.placement", "respawn_server.jobs.fleet.instances",
                        "respawn_server.jobs.fleet.providers")
DJANGO_FREE = ("respawn_server.jobs.fleet.policies", "respawn_server.jobs.fleet.providers", "respawn_server.jobs.money.ledger", "respawn_server.jobs.money.pricebook",
               "respawn_server.jobs.money.prices")


# The server's folders and the names they install under (setup.py).
INSTALLED_AS = {"controlplane": "respawn_server", "jobs": "respawn_server.jobs", "frontend": "respawn_server.frontend"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if root == ROOT and parts[0] in INSTALLED_AS:
        parts[:1] = INSTALLED_AS[parts[0]].split(".")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name `path` imports, anywhere in it (`from a import b` gives a and a.b)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def imports_by_module(root: Path) -> dict[str, set[str]]:
    """Each module under jobs/ (migrations aside) -> every name it imports."""
    return {module_name(path, root): imported_names(path, module_name(path, root))
            for path in (root / "jobs").rglob("*.py") if "migrations" not in path.parts}


def import_graph(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each jobs module -> the jobs modules it imports."""
    return {module: {name for name in names if name in imports and name != module}
            for module, names in imports.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done, on_path = set(), []

    def visit(module: str) -> list[str] | None:
        if module in on_path:
            return on_path[on_path.index(module):] + [module]
        if module in done:
            return None
        on_path.append(module)
        for target in sorted(graph[module]):
            if cycle := visit(target):
                return cycle
        on_path.pop()
        done.add(module)
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), None)


def subsystems(root: Path) -> list[Path]:
    return sorted(init.parent for init in (root / "jobs").glob("*/__init__.py")
                  if init.parent.name not in ("migrations", "management"))


def under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    return imports_by_module(ROOT)


def test_no_module_imports_itself_back_through_others(imports):
    cycle = find_cycle(import_graph(imports))
    assert cycle is None, " -> ".join(cycle)


def test_the_core_imports_no_subsystem(imports):
    wrong = {(module, name) for module, names in imports.items() if under(module, ["respawn_server.jobs.core"]) for name in names
             if under(name, ["respawn_server.jobs"]) and not under(name, ["respawn_server.jobs.core", "respawn_server.jobs.models"])
             and name != "respawn_server.jobs"}
    assert not wrong


def test_the_tables_import_no_subsystem(imports):
    # The tables are the layer under every subsystem (jobs/models/__init__.py): a core
    # module importing one must reach no other subsystem through it.
    wrong = {(module, name) for module, names in imports.items() if under(module, ["respawn_server.jobs.models"])
             for name in names if under(name, ["respawn_server.jobs"])
             and not under(name, ["respawn_server.jobs.models", "respawn_server.jobs.core.choices"])}
    assert not wrong


def test_subsystems_import_neither_the_api_nor_tasks_nor_the_dashboard(imports):
    inner = ["respawn_server.jobs.core", "respawn_server.jobs.fleet", "respawn_server.jobs.money", "respawn_server.jobs.people", "respawn_server.jobs.notify", "respawn_server.jobs.models",
             RECOVERY, REPORTS]
    wrong = {(module, name) for module, names in imports.items() if under(module, inner) for name in names
             if under(name, TOP_TIER)}
    assert not wrong


def test_nothing_the_notifications_build_on_imports_them(imports):
    # respawn_server.jobs.notify hears of happenings through respawn_server.jobs.core.signals: its senders never import it.
    wrong = {(module, name) for module, names in imports.items()
             if under(module, ["respawn_server.jobs.core", "respawn_server.jobs.fleet", "respawn_server.jobs.money", "respawn_server.jobs.people", "respawn_server.jobs.models",
                               RECOVERY, REPORTS])
             for name in names if under(name, ["respawn_server.jobs.notify"])}
    assert not wrong


def test_a_module_importing_one_that_imports_it_is_found():
    """The arrow issue 36 took out (orchestration imported services, which answered by
    nudges that came back to orchestration) is a cycle once it is an import: the layout
    test above fails on two modules as on a longer circle, and on none without one."""
    assert find_cycle({"fleet.a": {"recovery.b"}, "recovery.b": {"fleet.a"}}) == ["fleet.a", "recovery.b", "fleet.a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_recovery_imports_nothing_that_calls_it(imports):
    """Recovery is called by the agents' reports, the fleet's scheduler, launcher and
    reconciler, the tasks and the API: it imports none of them, only the core, money's
    budget and what places a VM (FLEET_UNDER_RECOVERY)."""
    wrong = {(module, name) for module, names in imports.items() if under(module, [RECOVERY]) for name in names
             if under(name, [*TOP_TIER, REPORTS])
             or (under(name, ["respawn_server.jobs.fleet"]) and name != "respawn_server.jobs.fleet"
                 and not under(name, FLEET_UNDER_RECOVERY))}
    assert not wrong


def test_what_recovery_builds_on_never_reaches_back_into_it(imports):
    graph = import_graph(imports)
    below = {name for module in graph if under(module, [RECOVERY]) for name in graph[module] if not under(name, [RECOVERY])}
    for module in below:
        reached, todo = set(), [module]
        while todo:
            current = todo.pop()
            reached.add(current)
            todo += graph[current] - reached
        assert not [m for m in reached if under(m, [RECOVERY, REPORTS])], f"{module} calls back into recovery"


def test_only_the_api_tasks_and_commands_import_the_reports(imports):
    """The agents' reports hand their work to recovery: nothing below them imports them."""
    wrong = {(module, name) for module, names in imports.items() if not under(module, [*TOP_TIER, REPORTS])
             for name in names if under(name, [REPORTS])}
    assert not wrong


def test_modules_that_say_no_django_import_none_even_through_others(imports):
    graph = import_graph(imports)
    for module in (m for m in graph if under(m, DJANGO_FREE)):
        reached, todo = set(), [module]
        while todo:
            current = todo.pop()
            reached.add(current)
            todo += graph[current] - reached
        django = {(m, name) for m in reached for name in imports[m]
                  if under(name, ["django", "rest_framework", "celery"])}
        assert not django, f"{module} imports Django through {sorted(django)}"


@pytest.mark.parametrize("subsystem", subsystems(ROOT), ids=lambda p: p.name)
def test_no_two_files_of_a_subsystem_share_a_name(subsystem):
    names = Counter(p.name for p in subsystem.rglob("*.py") if p.name != "__init__.py")
    assert not [name for name, count in names.items() if count > 1]


def test_every_subsystem_says_what_it_owns_and_may_import():
    for package in subsystems(ROOT):
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert docstring and "import" in docstring.lower(), package


def test_work_the_core_sends_by_name_reaches_a_task():
    from celery import current_app

    from respawn_server.jobs import tasks  # noqa: F401  (registers the tasks)
    from respawn_server.jobs.core import nudges

    sent = {value for name, value in vars(nudges).items() if name.isupper()}
    assert sent and sent <= set(current_app.tasks)


# ---- the library's namespace (DESIGN §12) ------------------------------------------------------

LIBRARY_ROOT = ROOT / "agents"  # the library's source root: its package is agents/respawn
SERVER = ("respawn_server", "jobs", "controlplane", "frontend", "django", "rest_framework", "celery", "boto3", "google.cloud", "azure")


def python_files() -> list[Path]:
    skip = {".venv", "node_modules", "var", "build", ".git"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def test_no_module_imports_a_top_level_agents():
    """`agents` is another project's import name (openai-agents): ours is `respawn`."""
    wrong = set()
    for path in python_files():
        module = module_name(path, LIBRARY_ROOT if path.is_relative_to(LIBRARY_ROOT) else ROOT)
        wrong |= {(str(path.relative_to(ROOT)), name) for name in imported_names(path, module) if under(name, ["agents"])}
        if path != Path(__file__).resolve() and re.search(r"""-m agents\b|["']-m["'], ["']agents["']""", path.read_text()):
            wrong.add((str(path.relative_to(ROOT)), "-m agents"))
    assert not wrong


def test_no_module_imports_a_server_folder_as_a_top_level_name():
    """The server installs as `respawn_server` only (issue 33): `frontend` and `jobs` are
    other projects' names, and a module imported under both names would be two modules."""
    wrong = set()
    for path in python_files():
        module = module_name(path, LIBRARY_ROOT if path.is_relative_to(LIBRARY_ROOT) else ROOT)
        wrong |= {(str(path.relative_to(ROOT)), name) for name in imported_names(path, module)
                  if under(name, list(INSTALLED_AS))}
    assert not wrong


def test_the_library_imports_nothing_of_the_server():
    """The library runs on VMs and in training images, and the CLI on laptops: no server
    module, no Django or Celery, and a cloud SDK only inside the storage backend that needs
    it, which `open_storage` imports when a URI of its scheme is opened."""
    backends = {"respawn.checkpoint.storage.s3", "respawn.checkpoint.storage.gcs", "respawn.checkpoint.storage.azure"}
    wrong = set()
    for path in (LIBRARY_ROOT / "respawn").rglob("*.py"):
        module = module_name(path, LIBRARY_ROOT)
        names = imported_names(path, module)
        forbidden = SERVER[:7] if module in backends else SERVER
        wrong |= {(module, name) for name in names if under(name, forbidden)}
    assert not wrong
