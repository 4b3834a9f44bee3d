"""Loaded with `-p` (pyproject's addopts): test modules run slowest first. The Makefile
hands whole modules to the xdist workers (`--dist loadscope`, so a module's fixtures are
made once) in collection order (`--no-loadscope-reorder`); xdist's own order, most tests
first, put the few-test e2e modules of a minute or more last, and the suite's final
minutes ran on one worker while the other sat idle. Longest first keeps both busy to the
end (the LPT rule). The seconds per module are recorded from a real run of the suite
(`python -m tests.slowest_first JUNIT_XML` rewrites them); a module not recorded yet
counts as a minute, so a new e2e module is not left for last."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

RECORD = Path(__file__).with_name("module_seconds.json")
UNRECORDED_S = 60.0


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    items.sort(key=lambda item: -seconds.get(_module(item.nodeid), UNRECORDED_S))  # stable: a module keeps its order


def record(junit_xml: str) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown) from pytest's JUnit XML."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).iter("testcase"):
        path = case.get("classname", "").split(".")
        # classname is the module's dotted path, then a test class if there is one.
        while path and not Path(*path).with_suffix(".py").exists():
            path.pop()
        if path:
            totals[str(Path(*path).with_suffix(".py"))] += float(case.get("time", 0))
    return {module: round(s, 1) for module, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    RECORD.write_text(json.dumps(record(sys.argv[1]), indent=0) + "\n")
    print(f"{RECORD}: {len(json.loads(RECORD.read_text()))} modules")
