"""Job spec files (`respawn submit job.yaml`) are outside data: whatever a file
holds, loading it gives a checked spec or InvalidSpec whose every problem names
the file, never another exception and never a spec missing a required field."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.cli.jobspec import FIELDS, InvalidSpec, load_job_spec

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8) | st.integers(), inner, max_size=3), max_leaves=8)
keys = st.sampled_from(sorted(FIELDS)) | st.text(max_size=12)
# What YAML can say that JSON cannot: tags, complex keys, anchors, dates, several documents.
odd_yaml = st.sampled_from([
    "name: !custom x\n", "command: !!python/object:os.system ls\n", "? [a, b]\n: 1\n", "? {a: 1}\n: x\n",
    "env: {? [k] : v}\n", "env: {A: &x [1], B: *x}\n", "deadline: 2026-12-01\n", "max_price_per_hour: .nan\n",
    "nodes: 0x10\n", "name: !!binary aGVsbG8=\n", "---\nname: a\n---\nname: b\n", "team: [1]\n", "command: ''\n",
    "env: !!set {a, b}\n", "nodes: !!float 2\n", "<<: {name: x}\n", "name: &a x\nteam: *a\n", "\t- x\n",
])
documents = st.one_of(
    st.text(max_size=300),
    st.dictionaries(keys, values, max_size=8).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.lists(odd_yaml, min_size=1, max_size=4).map("".join),
    st.tuples(st.dictionaries(keys, values, max_size=4), odd_yaml).map(lambda t: yaml.safe_dump(t[0]) + t[1]),
)


def load(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(text)
        try:
            return path, load_job_spec(path)
        except InvalidSpec as e:
            return path, e


@settings(max_examples=400, deadline=None)
@given(documents)
def test_any_file_gives_a_checked_spec_or_problems_naming_the_file(text):
    path, outcome = load(text)
    if isinstance(outcome, InvalidSpec):
        assert outcome.problems and all(p.startswith(str(path)) for p in outcome.problems), outcome.problems
    else:
        assert set(outcome.body) <= set(FIELDS)
        assert all(name in outcome.body for name, f in FIELDS.items() if f.required)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s.isprintable()),
       # A NUL cannot be in a process's arguments: a command word with one is refused.
       st.lists(st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=10), min_size=1, max_size=4),
       st.integers(1, 64))
def test_a_spec_written_from_good_values_reads_back_the_same(name, argv, nodes):
    path, outcome = load(yaml.safe_dump({"team": "vision", "name": name, "command": argv, "nodes": nodes}))
    assert not isinstance(outcome, InvalidSpec), outcome.problems
    assert outcome.body == {"team": "vision", "name": name, "command": argv, "nodes": nodes}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([n for n, f in FIELDS.items() if f.kind == "number"]), st.sampled_from([".nan", ".inf", "-.inf"]))
def test_a_number_field_refuses_nan_and_infinity_naming_the_field(name, number):
    path, outcome = load(f"team: vision\nname: x\ncommand: [python]\n{name}: {number}\n")
    assert isinstance(outcome, InvalidSpec)
    assert outcome.problems == [f"{path}:4: field '{name}': must be a finite number, got {yaml.safe_load(number)}"]
