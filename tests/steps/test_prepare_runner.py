"""The prepare step's runner (respawn.agent.prepare) against real local storage, with
the prepare command a real process. It runs the command once per content key, and
a later run with the same key fetches the stored outputs instead. (The runner is
called in-process: a process of its own would spend most of each test importing torch.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from respawn.agent.prepare import MANIFEST, main
from tests.conftest import ROOT

PREPARE = [sys.executable, "-m", "tests.steps.programs", "prepare"]


@pytest.fixture
def runner(tmp_path, monkeypatch, capfd):
    return Runner(tmp_path, monkeypatch, capfd)


class Runner:
    def __init__(self, tmp_path: Path, monkeypatch, capfd):
        self.tmp, self.capfd = tmp_path, capfd
        self.work = tmp_path / "work"
        self.work.mkdir()
        (self.work / "data.cfg").write_text("lowercase: true\n")
        self.out = tmp_path / "vm" / "prepare"
        self.counter = tmp_path / "prepare-runs"
        for name, value in {"PYTHONPATH": str(ROOT), "RESPAWN_PREPARE_DIR": str(self.out),
                            "STEPS_PREPARE_COUNTER": str(self.counter)}.items():
            monkeypatch.setenv(name, value)
        self.monkeypatch = monkeypatch

    def run(self, command=PREPARE, inputs=("data.cfg",), *extra: str, vocab: str = "v1") -> tuple[int, dict, str]:
        self.monkeypatch.setenv("STEPS_VOCAB", vocab)
        result = self.tmp / "result.json"
        code = main(["--storage", str(self.tmp / "ckpt" / "job-1"), "--out", str(self.out), "--result", str(result),
                     "--cwd", str(self.work), *[arg for path in inputs for arg in ("--input", path)], *extra,
                     "--", *command])
        said = self.capfd.readouterr()
        return code, json.loads(result.read_text()), said.out + said.err

    def runs(self) -> int:
        return len(self.counter.read_text().splitlines()) if self.counter.exists() else 0


def test_it_runs_once_and_a_later_run_fetches_the_stored_outputs(runner, tmp_path):
    code, first, _ = runner.run()
    assert code == 0 and first["outcome"] == "ran" and runner.runs() == 1
    stored = Path(first["uri"])
    assert stored == tmp_path / "ckpt" / "job-1" / "prepare" / first["key"]
    assert (stored / "outputs" / "vocab.txt").read_text() == "v1" and (stored / MANIFEST).exists()

    (runner.out / "vocab.txt").unlink()  # a new VM starts with nothing
    code, second, output = runner.run(vocab="would differ")
    assert code == 0 and second["outcome"] == "reused", output
    assert runner.runs() == 1 and (second["key"], second["uri"]) == (first["key"], first["uri"])
    assert (runner.out / "vocab.txt").read_text() == "v1"
    assert "command skipped" in output


def test_a_changed_command_or_input_runs_it_again(runner, tmp_path):
    keys = {runner.run()[1]["key"]}
    keys.add(runner.run([*PREPARE, "--version", "2"])[1]["key"])
    (runner.work / "data.cfg").write_text("lowercase: false\n")
    keys.add(runner.run()[1]["key"])
    assert runner.runs() == 3 and len(keys) == 3
    assert runner.run()[1]["outcome"] == "reused" and runner.runs() == 3


def test_a_directory_input_stands_for_every_file_under_it(runner, tmp_path):
    (runner.work / "conf" / "sub").mkdir(parents=True)
    (runner.work / "conf" / "sub" / "a.yaml").write_text("a: 1\n")
    first = runner.run(inputs=("conf",))[1]["key"]
    (runner.work / "conf" / "sub" / "a.yaml").write_text("a: 2\n")
    assert runner.run(inputs=("conf",))[1]["key"] != first and runner.runs() == 2


def test_damaged_stored_outputs_are_not_used_the_command_runs_again(runner, tmp_path):
    first = runner.run()[1]
    (Path(first["uri"]) / "outputs" / "vocab.txt").write_text("v0")  # same size, other bytes
    code, again, output = runner.run()
    assert code == 0 and again["outcome"] == "ran" and runner.runs() == 2, output
    assert "does not match its manifest" in output
    assert (runner.out / "vocab.txt").read_text() == (Path(again["uri"]) / "outputs" / "vocab.txt").read_text() == "v1"


def test_a_failing_command_or_a_missing_input_is_reported_and_nothing_is_stored(runner, tmp_path):
    code, failed, _ = runner.run([sys.executable, "-c", "raise SystemExit(3)"])
    assert (code, failed["outcome"], failed["message"]) == (3, "failed", "the prepare command exited with code 3")
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").rglob(MANIFEST))
    code, missing, output = runner.run(inputs=("data.cfg", "tokenizer.json"))
    assert code == 2 and missing["outcome"] == "failed" and runner.runs() == 0
    assert missing["message"].startswith("prepare input 'tokenizer.json' does not exist"), output


def test_without_storing_the_outputs_are_used_but_not_kept(runner, tmp_path):
    code, result, _ = runner.run(PREPARE, ("data.cfg",), "--no-store")
    assert code == 0 and result["outcome"] == "ran" and result["uri"] == ""
    assert (runner.out / "vocab.txt").read_text() == "v1"
    assert runner.run()[1]["outcome"] == "ran" and runner.runs() == 2
