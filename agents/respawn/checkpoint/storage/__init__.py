"""Storage backends behind one interface; `open_storage(uri)` picks one by scheme."""

from __future__ import annotations

from contextlib import contextmanager
from urllib.parse import urlparse

from .base import Storage, StorageError, UnknownSchemeError, Writer

__all__ = ["Storage", "StorageError", "UnknownSchemeError", "Writer", "open_storage", "rewrite_beside"]

# A verdict write lost to another writer's sweep is tried again this often (see rewrite_beside).
REWRITE_TRIES = 3


def open_storage(uri: str) -> Storage:
    """`/path` or `file:///path` (local), `s3://bucket/prefix`, `gs://bucket/prefix`,
    `az://container/prefix`. Cloud endpoints and credentials come from each SDK's
    standard environment (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST,
    AZURE_STORAGE_CONNECTION_STRING), so tests point them at emulators."""
    scheme = urlparse(uri).scheme
    if scheme in ("", "file"):
        from .local import LocalStorage

        return LocalStorage(uri)
    if scheme == "s3":
        with _sdk("s3", "boto3", ("boto3", "botocore")):
            from .s3 import S3Storage

        return S3Storage(uri)
    if scheme == "gs":
        with _sdk("gcs", "google-cloud-storage", ("google",)):
            from .gcs import GCSStorage

        return GCSStorage(uri)
    if scheme == "az":
        with _sdk("azure", "azure-storage-blob", ("azure",)):
            from .azure import AzureBlobStorage

        return AzureBlobStorage(uri)
    raise UnknownSchemeError(f"unknown storage URI scheme {scheme!r} in {uri!r}: use a path, file://, s3://, gs:// or az://")


def rewrite_beside(storage: Storage, key: str, data: bytes) -> None:
    """`storage.write_atomic(key, data)` for a small record beside a committed checkpoint
    (VALIDATION.json, VALIDATING.json) that any process may write again later.

    A process killed between such a write and its rename leaves a temp file that no
    commit sweeps (the checkpoint is already committed), so each write first drops the
    temp files earlier writes of `key` left. Two validators may write the same verdict at
    once (the trainer's on export, the agent's): one's sweep can take the other's temp
    file before its rename, and the loser writes again; both write the same verdict."""
    for attempt in range(REWRITE_TRIES):
        storage.discard_unfinished(key)
        try:
            storage.write_atomic(key, data)
            return
        except FileNotFoundError:  # our temp file was swept by a concurrent writer of `key`
            if attempt == REWRITE_TRIES - 1:
                raise


@contextmanager
def _sdk(extra: str, package: str, modules: tuple[str, ...]):
    """A backend's SDK is an extra of the library (the base install carries no cloud SDK):
    its absence is said as the install that fixes it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in modules:
            raise
        raise StorageError(f"this storage needs {package}, which is not installed: "
                           f"pip install 'respawn-ml[{extra}]'") from exc
