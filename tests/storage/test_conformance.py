"""One behaviour, four backends: local, S3 (moto), GCS (gcp-storage-emulator) and
Azure Blob (Azurite), each opened through `open_storage(uri)` with its real SDK.
The Checkpointer relies on exactly these semantics on every backend."""

from __future__ import annotations

import contextlib
import gc
import random

import pytest

from respawn.checkpoint.storage import StorageError

MIB = 1024 * 1024
# Above 2 parts at the default 8 MiB part / chunk size, so each backend's
# parallel-part (or resumable-chunk) path and its final commit really run.
MULTIPART_BYTES = 20 * MIB + 123


def random_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def write_in_uneven_chunks(writer, data: bytes) -> None:
    view = memoryview(data)
    rng = random.Random(1)
    offset = 0
    while offset < len(view):
        step = rng.randint(1, 3 * MIB)
        writer.write(view[offset : offset + step])
        offset += step


def test_it_makes_a_multipart_object_visible_only_on_close(storage):
    data = random_bytes(MULTIPART_BYTES)
    writer = storage.open_writer("job-7/step-00000100/__0_0.distcp")
    write_in_uneven_chunks(writer, data)
    assert not storage.exists("job-7/step-00000100/__0_0.distcp")
    assert storage.list("job-7") == []

    writer.close()

    assert storage.exists("job-7/step-00000100/__0_0.distcp")
    assert storage.size("job-7/step-00000100/__0_0.distcp") == len(data)
    assert storage.read("job-7/step-00000100/__0_0.distcp") == data


def test_a_background_writer_takes_page_aligned_and_unaligned_spans_alike(storage):
    """A paced persist's writer (on local disk: direct I/O for page-aligned spans of a
    writable buffer, the page cache for the rest) stores exactly the bytes it was given,
    whatever mix of alignments they came in, and the caller may reuse each span at once."""
    import torch

    from respawn.checkpoint.snapshot import PAGE, _page_aligned

    data = random_bytes(3 * MIB + 5 * PAGE + 17)
    aligned = _page_aligned(len(data))
    aligned.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    span = memoryview(aligned.numpy()).cast("B")
    # Spans starting on a page, mid-page (address and file offset alike), read-only copies.
    cuts = [0, 2 * MIB, 2 * MIB + 100, 2 * MIB + 100 + PAGE, 3 * MIB + 4 * PAGE, len(data)]
    copied = {2 * MIB + 100 + PAGE}
    writer = storage.open_writer("bg/data", background=True)
    for start, end in zip(cuts, cuts[1:]):
        piece = bytes(span[start:end]) if start in copied else span[start:end]
        writer.write(piece)
        if start not in copied:
            aligned[start:end].zero_()  # written: the persist may change it now
    writer.close()
    assert storage.read("bg/data") == data


def test_it_streams_and_seeks_through_an_object(storage):
    data = random_bytes(MULTIPART_BYTES, seed=2)
    writer = storage.open_writer("blob")
    writer.write(data)
    writer.close()

    with storage.open_reader("blob") as reader:
        head = reader.read(MIB)
        reader.seek(len(data) - 10)
        tail = reader.read()
        reader.seek(9 * MIB + 5)
        middle = reader.read(3 * MIB)
    assert head == data[:MIB]
    assert tail == data[-10:]
    assert middle == data[9 * MIB + 5 : 12 * MIB + 5]


def test_it_round_trips_an_empty_and_a_small_object(storage):
    for key, data in (("empty", b""), ("small", b"tiny payload")):
        writer = storage.open_writer(key)
        writer.write(data)
        writer.close()
        assert storage.read(key) == data
        assert storage.size(key) == len(data)


@pytest.mark.parametrize("length", [100, MULTIPART_BYTES], ids=["small", "multipart"])
def test_an_aborted_writer_leaves_no_object(storage, length):
    writer = storage.open_writer("job/step-1/data")
    write_in_uneven_chunks(writer, random_bytes(length))

    writer.abort()

    assert not storage.exists("job/step-1/data")
    assert storage.list("") == []


def test_an_aborted_overwrite_keeps_the_previous_object(storage):
    storage.write_atomic("job/LATEST", b"step-00000100")
    writer = storage.open_writer("job/LATEST")
    write_in_uneven_chunks(writer, random_bytes(MULTIPART_BYTES))

    writer.abort()

    assert storage.read("job/LATEST") == b"step-00000100"


def test_a_writer_dropped_without_close_never_commits(storage):
    writer = storage.open_writer("job/step-1/data")
    write_in_uneven_chunks(writer, random_bytes(MULTIPART_BYTES))

    del writer  # e.g. the persist thread died mid-file
    gc.collect()

    assert not storage.exists("job/step-1/data")


def test_a_killed_writers_unfinished_upload_is_listed_and_goes_with_its_directory(storage, backend):
    # Parts uploaded and never completed nor aborted: what a writer killed by SIGKILL leaves.
    killed = storage.open_writer("job/step-1/data")
    write_in_uneven_chunks(killed, random_bytes(MULTIPART_BYTES))
    storage.write_atomic("job/step-2/data", b"committed")
    earlier_attempt = storage.open_writer("job/step-2/data")
    write_in_uneven_chunks(earlier_attempt, random_bytes(MULTIPART_BYTES))
    # GCS keeps no bytes for an unfinished resumable upload; Azure drops uncommitted blocks after a week.
    keeps_them = backend in ("local", "s3")

    assert storage.unfinished("job") == (["job/step-1/data", "job/step-2/data"] if keeps_them else [])
    assert storage.list("job") == ["job/step-2/data"]

    storage.discard_unfinished("job/step-2")
    assert storage.unfinished("job") == (["job/step-1/data"] if keeps_them else [])
    assert storage.read("job/step-2/data") == b"committed"

    storage.delete_prefix("job/step-1")
    assert storage.unfinished("") == []
    assert storage.list("") == ["job/step-2/data"]
    for writer in (killed, earlier_attempt):
        with contextlib.suppress(StorageError):  # its upload is gone already
            writer.abort()


def test_write_atomic_replaces_the_whole_object(storage):
    storage.write_atomic("job/step-1/MANIFEST.json", b'{"files": {"a": 1}, "padding": "' + b"x" * 5000 + b'"}')
    storage.write_atomic("job/step-1/MANIFEST.json", b'{"files": {}}')

    assert storage.read("job/step-1/MANIFEST.json") == b'{"files": {}}'
    assert storage.size("job/step-1/MANIFEST.json") == len(b'{"files": {}}')


KEYS = [
    "job-7/step-00000200/state.json",
    "job-7/step-00000100/MANIFEST.json",
    "job-7/LATEST",
    "job-7/step-00000100/__0_0.distcp",
    "job-70/step-00000100/state.json",
    "job-7-other/LATEST",
]


def write_all(storage, keys):
    for key in keys:
        storage.write_atomic(key, key.encode())


def test_list_returns_keys_under_a_prefix_sorted(storage):
    write_all(storage, KEYS)

    assert storage.list("job-7") == [
        "job-7/LATEST",
        "job-7/step-00000100/MANIFEST.json",
        "job-7/step-00000100/__0_0.distcp",
        "job-7/step-00000200/state.json",
    ]
    assert storage.list("job-7/") == storage.list("job-7")
    assert storage.list("job-7/step-00000100") == ["job-7/step-00000100/MANIFEST.json", "job-7/step-00000100/__0_0.distcp"]
    assert storage.list("") == sorted(KEYS)
    assert storage.list("job-8") == []
    assert storage.list("job-7/LATEST") == ["job-7/LATEST"]  # a prefix naming one object


def test_delete_prefix_removes_that_prefix_and_nothing_beside_it(storage):
    write_all(storage, KEYS)

    storage.delete_prefix("job-7/step-00000100")
    assert storage.list("job-7") == ["job-7/LATEST", "job-7/step-00000200/state.json"]

    storage.delete_prefix("job-7/LATEST")  # a prefix naming one object
    assert storage.list("job-7") == ["job-7/step-00000200/state.json"]

    storage.delete_prefix("job-7")
    assert storage.list("") == ["job-7-other/LATEST", "job-70/step-00000100/state.json"]

    storage.delete_prefix("never-written")  # deleting nothing is not an error
    assert storage.list("") == ["job-7-other/LATEST", "job-70/step-00000100/state.json"]


def test_a_missing_object_is_a_clear_error(storage):
    assert not storage.exists("job/step-1/MANIFEST.json")
    for operation in (storage.read, storage.size, storage.open_reader):
        with pytest.raises(StorageError, match="job/step-1/MANIFEST.json"):
            operation("job/step-1/MANIFEST.json")


def test_a_key_escaping_the_root_is_refused(storage):
    with pytest.raises(StorageError, match=r"\.\./outside"):
        storage.write_atomic("../outside", b"x")


def test_url_for_names_the_object_under_the_root(storage):
    assert storage.url_for("job/LATEST") == f"{storage.uri}/job/LATEST"
