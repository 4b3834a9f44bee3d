"""Azure Blob storage: `az://container/prefix`.

The account comes from AZURE_STORAGE_CONNECTION_STRING (Azurite, keys, SAS) or
from AZURE_STORAGE_ACCOUNT_URL with DefaultAzureCredential (managed identity,
workload identity, `az login`). Large files are blocks staged in parallel and
made visible by one `commit_block_list` on close; staged but uncommitted blocks
are never readable, and the service drops them at the blob's next commit or
after a week.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.storage.blob import BlobBlock, BlobServiceClient

from .base import StorageError
from .objectstore import MissingObjectError, ObjectRoot, ObjectStorage, PartedUploadConfig, PartedWriter, open_ranged_reader

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_URL_ENV = "AZURE_STORAGE_ACCOUNT_URL"
DELETE_BATCH = 256  # a blob batch request carries at most 256 sub-requests


@contextmanager
def _azure_errors(url: str, container: str) -> Iterator[None]:
    """Turn SDK errors into StorageError naming the URI and the cause."""
    try:
        yield
    except ResourceNotFoundError as exc:
        if exc.error_code == "ContainerNotFound":
            raise StorageError(f"{url}: container {container!r} does not exist") from None
        raise MissingObjectError(f"{url} does not exist") from None
    except ClientAuthenticationError as exc:
        raise StorageError(f"{url}: authentication failed ({exc.message.splitlines()[0] if exc.message else exc})") from exc
    except ServiceRequestError as exc:
        raise StorageError(f"{url}: cannot reach the Azure Blob endpoint ({exc})") from exc
    except HttpResponseError as exc:
        code = getattr(exc.error_code, "value", exc.error_code) or exc.status_code  # an enum for known codes
        raise StorageError(f"{url}: Azure Blob error {code}: {exc.reason}") from exc
    except AzureError as exc:
        raise StorageError(f"{url}: {exc}") from exc


def _service_client(uri: str) -> BlobServiceClient:
    connection_string = os.environ.get(CONNECTION_STRING_ENV)
    if connection_string:
        try:
            return BlobServiceClient.from_connection_string(connection_string)
        except ValueError as exc:
            raise StorageError(f"{uri}: {CONNECTION_STRING_ENV} is malformed ({exc})") from None
    account_url = os.environ.get(ACCOUNT_URL_ENV)
    if account_url:
        from azure.identity import DefaultAzureCredential

        return BlobServiceClient(account_url, credential=DefaultAzureCredential())
    raise StorageError(
        f"{uri}: no Azure storage account configured: set {CONNECTION_STRING_ENV}, "
        f"or {ACCOUNT_URL_ENV} (https://ACCOUNT.blob.core.windows.net) with credentials DefaultAzureCredential finds"
    )


class AzureBlockWriter(PartedWriter):
    max_parts = 50_000

    def __init__(self, blob, container: str, url: str, config: PartedUploadConfig):
        super().__init__(url, config)
        self._blob = blob
        self._container = container
        # Block ids must have one length per blob, and a fresh prefix keeps this
        # writer's blocks apart from any an aborted writer left uncommitted.
        self._id_prefix = uuid.uuid4().hex

    def _block_id(self, number: int) -> str:
        return f"{self._id_prefix}-{number:06d}"

    def _start(self) -> None:
        pass  # Azure has no upload session: staging the first block starts it.

    def _upload_part(self, number: int, data: bytearray) -> str:
        block_id = self._block_id(number)
        with _azure_errors(self.url, self._container):
            self._blob.stage_block(block_id, bytes(data), length=len(data))
        return block_id

    def _complete(self, tokens: list[str]) -> None:
        with _azure_errors(self.url, self._container):
            self._blob.commit_block_list([BlobBlock(block_id=block_id) for block_id in tokens])

    def _abort(self) -> None:
        pass  # Uncommitted blocks are invisible and cannot be deleted one by one.

    def _put_whole(self, data: bytearray) -> None:
        with _azure_errors(self.url, self._container):
            self._blob.upload_blob(bytes(data), overwrite=True)


class AzureBlobStorage(ObjectStorage):
    def __init__(self, uri: str, config: PartedUploadConfig | None = None):
        self._root = ObjectRoot.parse(uri, "az")
        self.uri = self._root.uri
        self._config = config or PartedUploadConfig()
        self._container = _service_client(self.uri).get_container_client(self._root.bucket)
        self._probe()

    def _probe(self) -> None:
        """Fail at open, not mid-save, when the container or the credentials are wrong."""
        with self._errors(""):
            next(iter(self._container.list_blobs(name_starts_with=self._root.prefix, results_per_page=1)), None)

    def _errors(self, key: str):
        return _azure_errors(self._root.url_for(key), self._root.bucket)

    def _blob(self, key: str):
        return self._container.get_blob_client(self._root.object_name(key))

    def open_writer(self, key: str, background: bool = False) -> AzureBlockWriter:
        return AzureBlockWriter(self._blob(key), self._root.bucket, self.url_for(key), self._config)

    def write_atomic(self, key: str, data: bytes) -> None:
        blob = self._blob(key)
        with self._errors(key):
            blob.upload_blob(data, overwrite=True)

    def open_reader(self, key: str) -> BinaryIO:
        blob = self._blob(key)
        with self._errors(key):
            properties = blob.get_blob_properties()

        def fetch(offset: int, length: int) -> bytes:
            # Pinned to the ETag seen at open: an overwrite mid-read fails loudly
            # instead of splicing two versions.
            with self._errors(key):
                return blob.download_blob(
                    offset=offset, length=length, etag=properties.etag, match_condition=MatchConditions.IfNotModified
                ).readall()

        return open_ranged_reader(properties.size, fetch)

    def read(self, key: str) -> bytes:
        blob = self._blob(key)
        with self._errors(key):
            return blob.download_blob().readall()

    def size(self, key: str) -> int:
        blob = self._blob(key)
        with self._errors(key):
            return blob.get_blob_properties().size

    def list(self, prefix: str) -> list[str]:
        with self._errors(prefix):
            names = [item.name for item in self._container.list_blobs(name_starts_with=self._root.list_prefix(prefix))]
        return self._root.keys_under(prefix, names)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        for start in range(0, len(keys), DELETE_BATCH):
            names = [self._root.object_name(key) for key in keys[start : start + DELETE_BATCH]]
            with self._errors(prefix):
                self._container.delete_blobs(*names)

    def unfinished(self, prefix: str) -> list[str]:
        """Always empty: a killed writer's uncommitted blocks are not swept here; Azure
        discards them a week after their last upload (they take space until then)."""
        return []

    def discard_unfinished(self, prefix: str) -> None:
        pass  # see `unfinished`
