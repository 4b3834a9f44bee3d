"""What a user sees when an object store is misconfigured or fails mid-upload:
a StorageError naming the URI and the cause, and never a partial object."""

from __future__ import annotations

import os
import time

import pytest

from respawn.checkpoint.storage import StorageError, UnknownSchemeError, open_storage
from respawn.checkpoint.storage.gcs import GCSStorage
from respawn.checkpoint.storage.objectstore import PartedUploadConfig

from .conftest import CLOUD_BACKENDS, SCHEMES
from .test_conformance import MULTIPART_BYTES, random_bytes, write_in_uneven_chunks

MIB = 1024 * 1024


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", CLOUD_BACKENDS)
def test_a_missing_bucket_is_named_at_open(backend, request):
    request.getfixturevalue(f"{backend}_env")
    uri = f"{SCHEMES[backend]}://no-such-bucket-42/runs"

    with pytest.raises(StorageError, match=rf"{uri}: (bucket|container) 'no-such-bucket-42' does not exist"):
        open_storage(uri)


def test_s3_without_credentials_says_how_to_provide_them(s3_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to fall back on

    with pytest.raises(StorageError, match=r"s3://ckpt/runs: no AWS credentials found \(set AWS_ACCESS_KEY_ID"):
        open_storage("s3://ckpt/runs")


def test_s3_an_unreachable_endpoint_is_named(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # discard port: nothing listens

    with pytest.raises(StorageError, match=r"^s3://ckpt/runs: cannot reach the S3 endpoint http://127.0.0.1:9$"):
        open_storage("s3://ckpt/runs")


def test_gcs_without_credentials_says_how_to_provide_them(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login on this machine
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # and not a GCE VM

    with pytest.raises(StorageError, match=r"gs://ckpt/runs: no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS"):
        open_storage("gs://ckpt/runs")


def test_azure_without_an_account_names_both_settings(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_URL", raising=False)

    with pytest.raises(StorageError, match=r"az://ckpt/runs: no Azure storage account configured: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_URL"):
        open_storage("az://ckpt/runs")


@pytest.mark.parametrize("uri", ["s3://", "gs:///prefix", "az://"])
def test_a_uri_without_a_bucket_is_refused(uri):
    with pytest.raises(StorageError, match="names no bucket"):
        open_storage(uri)


def test_an_unknown_scheme_is_refused():
    with pytest.raises(UnknownSchemeError, match="'ftp'"):
        open_storage("ftp://host/ckpt")


def test_part_sizes_s3_would_refuse_are_rejected_up_front():
    with pytest.raises(ValueError, match="below 5 MiB"):
        PartedUploadConfig(part_size=MIB)


def test_gcs_chunk_sizes_off_the_256k_grid_are_rejected_up_front():
    with pytest.raises(ValueError, match="multiple of 262144"):
        GCSStorage("gs://ckpt/runs", chunk_size=MIB + 1)


@pytest.mark.parametrize("backend", CLOUD_BACKENDS)
def test_a_closed_writer_refuses_more_data(backend, storage):
    writer = storage.open_writer("job/data")
    writer.write(b"abc")
    writer.close()

    with pytest.raises(StorageError, match=r"job/data: writer is already closed"):
        writer.write(b"more")
    writer.abort()  # after a commit, abort leaves the object alone
    assert storage.read("job/data") == b"abc"


@pytest.mark.parametrize("backend", ["s3"])
def test_s3_an_upload_aborted_elsewhere_fails_the_writer_and_publishes_nothing(backend, storage):
    """E.g. a lifecycle rule that aborts incomplete multipart uploads."""
    import boto3

    s3 = boto3.client("s3")
    bucket = storage.uri.removeprefix("s3://").split("/")[0]
    data = random_bytes(MULTIPART_BYTES)
    writer = storage.open_writer("job/step-1/data")
    writer.write(data[: 9 * MIB])  # one part on its way: the multipart upload exists
    (upload,) = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    wait_until(lambda: s3.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts"))
    s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    # Real S3 answers NoSuchUpload; moto 5.2.5 answers a part for an aborted upload with a 500.
    with pytest.raises(StorageError, match=r"s3://ckpt-\w+/runs/r1/job/step-1/data: S3 error (NoSuchUpload|500)"):
        writer.write(data[9 * MIB :])
        writer.close()
    assert not storage.exists("job/step-1/data")


@pytest.mark.parametrize("backend", ["s3"])
def test_s3_large_objects_go_up_as_parallel_parts(backend, storage):
    import boto3

    writer = storage.open_writer("job/data")
    write_in_uneven_chunks(writer, random_bytes(MULTIPART_BYTES))
    writer.close()

    bucket = storage.uri.removeprefix("s3://").split("/")[0]
    etag = boto3.client("s3").head_object(Bucket=bucket, Key="runs/r1/job/data")["ETag"]
    assert etag.endswith('-3"')  # S3 names a multipart object's part count in its ETag


@pytest.mark.parametrize("backend", ["azure"])
def test_azure_a_blob_leased_by_someone_else_fails_the_writer_and_keeps_the_old_blob(backend, storage):
    from azure.storage.blob import BlobServiceClient

    storage.write_atomic("job/LATEST", b"step-00000100")
    container = storage.uri.removeprefix("az://").split("/")[0]
    blob = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).get_blob_client(
        container, "runs/r1/job/LATEST"
    )
    blob.acquire_lease(lease_duration=-1)

    writer = storage.open_writer("job/LATEST")
    with pytest.raises(StorageError, match=r"az://ckpt-\w+/runs/r1/job/LATEST: Azure Blob error LeaseIdMissing"):
        write_in_uneven_chunks(writer, random_bytes(MULTIPART_BYTES))
        writer.close()
    assert storage.read("job/LATEST") == b"step-00000100"


@pytest.mark.parametrize("backend", ["s3"])
def test_an_object_past_the_part_limit_is_refused_and_not_published(backend, cloud_uri):
    from respawn.checkpoint.storage.s3 import S3Storage

    storage = S3Storage(cloud_uri, PartedUploadConfig(part_size=5 * MIB, max_concurrency=2))
    writer = storage.open_writer("job/data")
    writer.max_parts = 2  # S3's real limit is 10,000 parts; the check is the same

    with pytest.raises(StorageError, match=r"job/data: object exceeds 2 parts; raise part_size"):
        writer.write(random_bytes(15 * MIB))
    assert not storage.exists("job/data")
