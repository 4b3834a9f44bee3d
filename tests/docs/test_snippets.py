"""Every training script the docs print runs, as printed, under `respawn-agent preflight`
and passes: the README's loop, docs/data-loading.md's and each framework page's. A block
is marked for this by a line `<!-- preflight: --framework NAME -->` right before its
```python fence; an edit that breaks a marked block, or drops a page's only one, fails
here (a fragment with placeholders cannot pass, and a loop that reports no loss fails
preflight's comparison)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"^<!-- preflight: --framework (\w+) -->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
STEPS = 60  # each snippet sleeps a little per step, so the notice lands mid-run after two checkpoints
# Pages whose training script must stay runnable: a page that loses its marker fails.
PAGES = ("README.md", "docs/data-loading.md", "docs/frameworks/hf.md", "docs/frameworks/lightning.md",
         "docs/frameworks/accelerate.md", "docs/frameworks/jax.md")
NEEDS = {  # what each kind of script imports beyond torch (the extras of pyproject.toml)
    "torch": ("torchdata",),
    "hf": ("transformers", "accelerate"),
    "lightning": ("lightning", "torchdata"),
    "accelerate": ("accelerate",),
    "jax": ("flax", "optax", "orbax.checkpoint"),
}

pytestmark = pytest.mark.e2e  # four real training runs per block


def marked_blocks(page: str) -> list[tuple[str, int, str]]:
    """(framework, line of the marker, code) of each marked block on the page."""
    text = (ROOT / page).read_text()
    return [(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2)) for m in MARKED.finditer(text)]


def all_blocks() -> list:
    pages = sorted({*PAGES, *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))})
    return [pytest.param(page, framework, code, id=f"{page}:{line}")
            for page in pages for framework, line, code in marked_blocks(page)]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_has_a_runnable_training_script(page):
    assert [framework for framework, _, _ in marked_blocks(page)], \
        f"{page} has no block marked `<!-- preflight: --framework NAME -->` before its ```python fence"


@pytest.mark.parametrize("page, framework, code", all_blocks())
def test_the_snippet_passes_preflight_as_printed(page, framework, code, tmp_path):
    assert framework in NEEDS, f"{page}: unknown framework {framework!r} in its preflight marker"
    for module in NEEDS[framework]:
        pytest.importorskip(module)
    script = tmp_path / "snippet.py"  # not named after a module it imports (jax.py would shadow jax)
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "respawn.agent", "preflight", "--steps", str(STEPS), "--checkpoint-interval-s", "0.2",
         "--notice-budget-s", "20", "--run-timeout-s", "200", "--framework", framework,
         "--work-dir", str(tmp_path / "preflight"), "--", sys.executable, str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)  # cwd: what the script writes stays here
    assert proc.returncode == 0 and "PREFLIGHT PASSED" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"same loss at {STEPS} compared step(s)" in proc.stdout, proc.stdout[-4000:]
    assert f"({framework} checkpoints)" in proc.stdout, proc.stdout[-4000:]  # the checkpoints say what wrote them
