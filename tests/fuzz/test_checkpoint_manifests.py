"""MANIFEST.json is read back from storage anyone with the bucket can write to:
whatever bytes it holds, reading it gives a manifest whose every field is usable
(a non-negative whole step and sizes, text digests, files inside the
checkpoint) or CorruptCheckpointError naming the checkpoint; never another
exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.checkpoint import manifest
from respawn.checkpoint.errors import CorruptCheckpointError
from respawn.checkpoint.manifest import FileEntry
from respawn.checkpoint.storage import open_storage

CKPT = "job-1/step-00000007"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
names = st.sampled_from(["model.safetensors", "state.json", "__0_0.distcp", "", "../step-00000006/state.json",
                         "/etc/passwd", "a/../../b", "sub/dir/ok.bin"]) | st.text(max_size=12)
entries = st.fixed_dictionaries({"size": json_values | st.integers(-5, 10**12), "digest": json_values | st.text()})
bodies = st.fixed_dictionaries({
    "format": st.just("respawn-checkpoint/1") | json_values,
    "step": st.integers(-3, 10**9) | json_values,
    "digest_algorithm": st.just(manifest.ALGORITHM) | json_values,
    "files": st.dictionaries(names, entries | json_values, max_size=3) | json_values,
})
documents = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    bodies.map(lambda b: json.dumps(b).encode()),
    st.tuples(bodies, st.integers(1, 40)).map(lambda t: json.dumps(t[0]).encode()[: -t[1]]),  # torn write
)


def read_back(raw: bytes):
    with tempfile.TemporaryDirectory() as root:
        # Written plainly, not through the storage's fsyncing commit: these bytes may be anything.
        (Path(root) / CKPT).mkdir(parents=True)
        (Path(root) / CKPT / "MANIFEST.json").write_bytes(raw)
        storage = open_storage(root)
        try:
            return manifest.read(storage, CKPT)
        except CorruptCheckpointError as e:
            assert CKPT in str(e) and "MANIFEST.json" in str(e)
            return None


def inside_the_checkpoint(name: str) -> bool:
    return bool(name) and not name.startswith("/") and ".." not in name.split("/")


@settings(max_examples=300, deadline=None)
@given(documents)
def test_any_manifest_bytes_read_as_a_usable_manifest_or_a_named_corruption(raw):
    found = read_back(raw)
    if found is not None:
        assert type(found.step) is int and found.step >= 0
        for name, entry in found.files.items():
            assert inside_the_checkpoint(name), name
            assert type(entry.size) is int and entry.size >= 0 and isinstance(entry.digest, str)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**9), st.dictionaries(st.text(min_size=1, max_size=12).filter(inside_the_checkpoint),
                                              st.builds(FileEntry, st.integers(0, 10**12), st.text(max_size=32)),
                                              max_size=4))
def test_what_the_writer_encodes_reads_back_the_same(step, files):
    raw = manifest.encode(step, files, "2026-11-29T22:00:00Z")
    found = read_back(raw)
    assert (found.step, found.files, found.raw) == (step, files, raw)
