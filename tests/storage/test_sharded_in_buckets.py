"""A gang's sharded (DCP) checkpoint in a bucket, where a multi-node job on a cloud keeps
it (no folder is shared by its nodes): every rank writes its part through our storage
layer into the emulated bucket, rank 0 commits it under our protocol, a gang of another
size resumes from it bitwise, and the validator reads it from the bucket."""

from __future__ import annotations

import json

import pytest

from respawn.checkpoint import layout, manifest
from respawn.checkpoint.storage import open_storage
from tests.checkpoint.test_eval_fn import validate_cli
from tests.checkpoint.test_sharded import VALIDATION, global_batches, resume, resumed_batches, write

from .conftest import CLOUD_BACKENDS


@pytest.mark.parametrize("backend", CLOUD_BACKENDS)
def test_an_fsdp2_gang_commits_into_a_bucket_and_a_smaller_gang_resumes_from_it_bitwise(backend, cloud_uri, tmp_path):
    write(tmp_path, "fsdp", 2, 6, uri=cloud_uri, keep=2, validation=VALIDATION)
    bucket = open_storage(cloud_uri)
    step = layout.step_dir(6)
    assert bucket.read(layout.LATEST).decode() == step
    assert not bucket.list(layout.step_dir(2))  # rotated away, as on a disk
    man = manifest.verify_all(bucket, step)  # every file's bytes match the digest taken as it was written
    shards = {name for name in man.files if name.endswith(".distcp")}
    assert {name.split("_")[2] for name in shards} == {"0", "1"}  # each rank wrote its own shards
    assert {".metadata", layout.STATE, "rank-0.json", "rank-1.json"} <= man.files.keys()
    assert sorted(bucket.list(step)) == sorted(f"{step}/{name}" for name in [*man.files, layout.MANIFEST])
    assert bucket.unfinished("") == []
    assert "reference_loss" in json.loads(bucket.read(f"{step}/{layout.STATE}"))

    assert resume(tmp_path, cloud_uri, "fsdp", 1) == [0]  # resharded 2 -> 1, bitwise (checked in each rank)
    assert resumed_batches(tmp_path, 1) == (6, global_batches(6))
    code, verdict = validate_cli(f"{cloud_uri}/{step}")
    assert (code, verdict["result"]) == (0, "valid"), verdict
