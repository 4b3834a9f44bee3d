import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "simulate.py"


@pytest.fixture(scope="session")
def simulator():
    """bench/simulate.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_simulate", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
