"""Storage backends behind one interface; `open_storage(uri)` picks one by scheme."""

from __future__ import annotations

from urllib.parse import urlparse

from .base import Storage, StorageError, UnknownSchemeError, Writer

__all__ = ["Storage", "StorageError", "UnknownSchemeError", "Writer", "open_storage"]


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
        from .s3 import S3Storage

        return S3Storage(uri)
    if scheme == "gs":
        from .gcs import GCSStorage

        return GCSStorage(uri)
    if scheme == "az":
        from .azure import AzureBlobStorage

        return AzureBlobStorage(uri)
    raise UnknownSchemeError(f"unknown storage URI scheme {scheme!r} in {uri!r}: use a path, file://, s3://, gs:// or az://")
