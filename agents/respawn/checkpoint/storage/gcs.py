"""Google Cloud Storage: `gs://bucket/prefix`.

Credentials come from Application Default Credentials; with STORAGE_EMULATOR_HOST
set (an emulator) the client is anonymous and the project is
GOOGLE_CLOUD_PROJECT or "emulator". Large files stream through one resumable
upload, which creates the object only when its last chunk is sent on close.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import BinaryIO, Iterator

import requests
from google.api_core.exceptions import Forbidden, GoogleAPICallError, NotFound
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.cloud import storage
from google.cloud.storage.fileio import BlobWriter
from google.cloud.storage.retry import DEFAULT_RETRY

from .base import StorageError
from .objectstore import MIB, MissingObjectError, ObjectRoot, ObjectStorage, open_ranged_reader

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
RESUMABLE_CHUNK_MULTIPLE = 256 * 1024  # GCS wants resumable chunks in multiples of 256 KiB
DELETE_BATCH = 100  # per batch request; the API allows 1000 but recommends 100
# An overwrite of the same bytes is idempotent, so small uploads may retry even
# though they carry no generation precondition.
IDEMPOTENT_RETRY: Retry = DEFAULT_RETRY


@contextmanager
def _gcs_errors(url: str, bucket: str, missing: str = "object") -> Iterator[None]:
    """Turn SDK errors into StorageError naming the URI and the cause. `missing`
    says what a 404 means here: the object, or (when probing) the bucket."""
    try:
        yield
    except NotFound:
        if missing == "bucket":
            raise StorageError(f"{url}: bucket {bucket!r} does not exist") from None
        raise MissingObjectError(f"{url} does not exist") from None
    except Forbidden as exc:
        raise StorageError(f"{url}: access denied ({exc.message}); check the credentials and the bucket's IAM") from None
    except GoogleAPICallError as exc:
        raise StorageError(f"{url}: GCS error {exc.code}: {exc.message}") from exc
    except GoogleAuthError as exc:
        raise StorageError(f"{url}: Google credentials failed ({exc})") from exc
    except requests.ConnectionError as exc:
        raise StorageError(f"{url}: cannot reach the GCS endpoint ({exc})") from exc


def _client(uri: str) -> storage.Client:
    if os.environ.get(EMULATOR_ENV):
        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"), credentials=AnonymousCredentials())
    try:
        return storage.Client()
    except DefaultCredentialsError:
        raise StorageError(
            f"{uri}: no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS, run "
            f"`gcloud auth application-default login`, run on GCP with a service account, or set {EMULATOR_ENV}"
        ) from None


class _NoCommitOnDrop(BlobWriter):
    # io.IOBase's finaliser calls close(), and BlobWriter.close() finalises the
    # upload: a writer dropped mid-stream would publish a partial object.
    def __del__(self) -> None:
        if not self.closed:
            try:
                self.terminate()
            except Exception:
                pass


class GCSWriter:
    """One object through a resumable upload; it exists only after `close()`."""

    def __init__(self, blob: storage.Blob, url: str, bucket: str, chunk_size: int):
        self.url = url
        self._bucket = bucket
        self._stream = _NoCommitOnDrop(blob, chunk_size=chunk_size, ignore_flush=True)
        self._state = "open"

    def write(self, data: bytes | memoryview) -> int:
        self._check_open()
        try:
            with _gcs_errors(self.url, self._bucket):
                self._stream.write(data)
        except BaseException:
            self.abort()
            raise
        return memoryview(data).nbytes

    def close(self) -> None:
        self._check_open()
        try:
            with _gcs_errors(self.url, self._bucket):
                self._stream.close()
        except BaseException:
            self.abort()
            raise
        self._state = "closed"

    def abort(self) -> None:
        """Cancel the upload session. A no-op after a successful `close()`."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            self._stream.terminate()
        except (GoogleAPICallError, requests.RequestException):
            pass  # an unfinished session is invisible and expires on its own

    def _check_open(self) -> None:
        if self._state != "open":
            raise StorageError(f"{self.url}: writer is already {self._state}")


class GCSStorage(ObjectStorage):
    def __init__(self, uri: str, chunk_size: int = 8 * MIB):
        if chunk_size <= 0 or chunk_size % RESUMABLE_CHUNK_MULTIPLE:
            raise ValueError(f"chunk_size={chunk_size} must be a positive multiple of {RESUMABLE_CHUNK_MULTIPLE} (256 KiB)")
        self._root = ObjectRoot.parse(uri, "gs")
        self.uri = self._root.uri
        self._chunk_size = chunk_size
        self._client = _client(self.uri)
        self._bucket = self._client.bucket(self._root.bucket)
        self._probe()

    def _probe(self) -> None:
        """Fail at open, not mid-save, when the bucket or the credentials are wrong.
        A listing needs only object permissions, unlike fetching the bucket."""
        with _gcs_errors(self.uri, self._root.bucket, missing="bucket"):
            next(iter(self._client.list_blobs(self._bucket, prefix=self._root.prefix, max_results=1)), None)

    def _errors(self, key: str):
        return _gcs_errors(self._root.url_for(key), self._root.bucket)

    def _blob(self, key: str) -> storage.Blob:
        return self._bucket.blob(self._root.object_name(key))

    def open_writer(self, key: str, background: bool = False) -> GCSWriter:
        return GCSWriter(self._blob(key), self.url_for(key), self._root.bucket, self._chunk_size)

    def write_atomic(self, key: str, data: bytes) -> None:
        blob = self._blob(key)
        with self._errors(key):
            blob.upload_from_string(data, retry=IDEMPOTENT_RETRY)

    def _existing_blob(self, key: str) -> storage.Blob:
        with self._errors(key):
            blob = self._bucket.get_blob(self._root.object_name(key))
        if blob is None:
            raise MissingObjectError(f"{self.url_for(key)} does not exist")
        return blob

    def open_reader(self, key: str) -> BinaryIO:
        # get_blob() pins the generation, so every range comes from the version
        # seen at open even if the object is overwritten mid-read.
        blob = self._existing_blob(key)

        def fetch(offset: int, length: int) -> bytes:
            with self._errors(key):
                return blob.download_as_bytes(start=offset, end=offset + length - 1, checksum=None)

        return open_ranged_reader(blob.size, fetch)

    def read(self, key: str) -> bytes:
        blob = self._blob(key)
        with self._errors(key):
            return blob.download_as_bytes()

    def size(self, key: str) -> int:
        return self._existing_blob(key).size

    def list(self, prefix: str) -> list[str]:
        with self._errors(prefix):
            names = [blob.name for blob in self._client.list_blobs(self._bucket, prefix=self._root.list_prefix(prefix))]
        return self._root.keys_under(prefix, names)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        for start in range(0, len(keys), DELETE_BATCH):
            with self._errors(prefix), self._client.batch(raise_exception=True):
                for key in keys[start : start + DELETE_BATCH]:
                    self._blob(key).delete()

    def unfinished(self, prefix: str) -> list[str]:
        """Always empty: an unfinished resumable upload holds no object and no billed
        bytes, and the service drops its session after a week."""
        return []

    def discard_unfinished(self, prefix: str) -> None:
        pass  # see `unfinished`
