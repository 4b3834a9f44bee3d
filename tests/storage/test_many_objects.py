"""Deletes larger than one batch (S3: 1000 keys, GCS: 100, Azure: 256), and on S3
a listing longer than one page (1000 keys)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

# One past each backend's delete batch (and S3's page); GCS's 1000-key page is
# left out because the emulator serves one request at a time (~40 s for 1000).
COUNTS = {"s3": 1001, "gcs": 101, "azure": 257}


@pytest.mark.parametrize("backend", list(COUNTS))
def test_list_and_delete_prefix_cover_more_than_one_batch(backend, storage):
    keys = [f"job/step-00000001/shard-{i:05d}" for i in range(COUNTS[backend])]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: storage.write_atomic(key, b"x"), keys))
    storage.write_atomic("other/LATEST", b"step-1")

    assert storage.list("job") == keys

    storage.delete_prefix("job")
    assert storage.list("") == ["other/LATEST"]
