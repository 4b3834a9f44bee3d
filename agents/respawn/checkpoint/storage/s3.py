"""Amazon S3 (and S3-compatible) storage: `s3://bucket/prefix`.

Endpoint and credentials come from boto3's standard environment and chain
(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, profiles, instance
roles). Large files are multipart uploads whose parts go up in parallel and which
exist only once `CompleteMultipartUpload` succeeds; small objects are one PUT,
which S3 makes visible whole or not at all.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import BinaryIO, Iterator
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from .base import StorageError
from .objectstore import MissingObjectError, ObjectRoot, ObjectStorage, PartedUploadConfig, PartedWriter, open_ranged_reader

DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys
CHECKSUM = "CRC32"  # what boto3's own transfers ask for (s3transfer's default)
MISSING_KEY_CODES = ("404", "NoSuchKey")
ACCESS_DENIED_CODES = ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


@contextmanager
def _s3_errors(url: str, bucket: str) -> Iterator[None]:
    """Turn SDK errors into StorageError naming the URI and the cause."""
    try:
        yield
    except NoCredentialsError:
        raise StorageError(
            f"{url}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or run with an instance role)"
        ) from None
    except EndpointConnectionError as exc:
        endpoint = urlsplit(exc.kwargs.get("endpoint_url", ""))
        raise StorageError(f"{url}: cannot reach the S3 endpoint {endpoint.scheme}://{endpoint.netloc}") from exc
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise StorageError(f"{url}: bucket {bucket!r} does not exist") from None
        if code in MISSING_KEY_CODES:
            raise MissingObjectError(f"{url} does not exist") from None
        if code in ACCESS_DENIED_CODES:
            raise StorageError(f"{url}: access denied ({code}); check the credentials and the bucket policy") from None
        message = exc.response.get("Error", {}).get("Message", "")
        raise StorageError(f"{url}: S3 error {code}: {message}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"{url}: {exc}") from exc


class S3Writer(PartedWriter):
    max_parts = 10_000

    def __init__(self, client, bucket: str, name: str, url: str, config: PartedUploadConfig):
        super().__init__(url, config)
        self._client = client
        self._bucket = bucket
        self._name = name
        self._upload_id: str | None = None

    def _start(self) -> None:
        with _s3_errors(self.url, self._bucket):
            response = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name, ChecksumAlgorithm=CHECKSUM)
        self._upload_id = response["UploadId"]

    def _upload_part(self, number: int, data: bytearray) -> dict:
        with _s3_errors(self.url, self._bucket):
            response = self._client.upload_part(
                Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, PartNumber=number,
                Body=data, ChecksumAlgorithm=CHECKSUM,
            )
        part = {"PartNumber": number, "ETag": response["ETag"]}
        if f"Checksum{CHECKSUM}" in response:
            part[f"Checksum{CHECKSUM}"] = response[f"Checksum{CHECKSUM}"]
        return part

    def _complete(self, tokens: list[dict]) -> None:
        with _s3_errors(self.url, self._bucket):
            self._client.complete_multipart_upload(
                Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, MultipartUpload={"Parts": tokens}
            )

    def _abort(self) -> None:
        with _s3_errors(self.url, self._bucket):
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._name, UploadId=self._upload_id)

    def _put_whole(self, data: bytearray) -> None:
        with _s3_errors(self.url, self._bucket):
            self._client.put_object(Bucket=self._bucket, Key=self._name, Body=bytes(data))


class S3Storage(ObjectStorage):
    def __init__(self, uri: str, config: PartedUploadConfig | None = None):
        self._root = ObjectRoot.parse(uri, "s3")
        self.uri = self._root.uri
        self._config = config or PartedUploadConfig()
        # Several files upload at once, each with max_concurrency parts in flight.
        pool = max(64, 4 * self._config.max_concurrency)
        # Every part carries a CRC32 that S3 checks, so a SHA-256 of the body in the
        # signature adds nothing but a second pass over every byte. botocore already
        # leaves it out over https; on plain http (MinIO on a LAN, emulators) it would
        # hash every part, so it is turned off here explicitly.
        self._client = boto3.session.Session().client("s3", config=Config(
            max_pool_connections=pool, retries={"mode": "standard"}, s3={"payload_signing_enabled": False},
        ))
        self._probe()

    def _probe(self) -> None:
        """Fail at open, not mid-save, when the bucket or the credentials are wrong."""
        with self._errors(""):
            self._client.list_objects_v2(Bucket=self._root.bucket, Prefix=self._root.prefix, MaxKeys=1)

    def _errors(self, key: str):
        return _s3_errors(self._root.url_for(key), self._root.bucket)

    def open_writer(self, key: str, background: bool = False) -> S3Writer:
        return S3Writer(self._client, self._root.bucket, self._root.object_name(key), self.url_for(key), self._config)

    def write_atomic(self, key: str, data: bytes) -> None:
        name = self._root.object_name(key)
        with self._errors(key):
            self._client.put_object(Bucket=self._root.bucket, Key=name, Body=data)

    def open_reader(self, key: str) -> BinaryIO:
        name = self._root.object_name(key)
        with self._errors(key):
            head = self._client.head_object(Bucket=self._root.bucket, Key=name)

        def fetch(offset: int, length: int) -> bytes:
            # Pinned to the ETag seen at open: an overwrite mid-read fails loudly
            # instead of splicing two versions.
            with self._errors(key):
                response = self._client.get_object(
                    Bucket=self._root.bucket, Key=name, Range=f"bytes={offset}-{offset + length - 1}", IfMatch=head["ETag"]
                )
                return response["Body"].read()

        return open_ranged_reader(head["ContentLength"], fetch)

    def read(self, key: str) -> bytes:
        with self._errors(key):
            return self._client.get_object(Bucket=self._root.bucket, Key=self._root.object_name(key))["Body"].read()

    def size(self, key: str) -> int:
        with self._errors(key):
            return self._client.head_object(Bucket=self._root.bucket, Key=self._root.object_name(key))["ContentLength"]

    def _names_under(self, prefix: str) -> list[str]:
        names = []
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors(prefix):
            for page in paginator.paginate(Bucket=self._root.bucket, Prefix=self._root.list_prefix(prefix)):
                names.extend(item["Key"] for item in page.get("Contents", []))
        return names

    def list(self, prefix: str) -> list[str]:
        return self._root.keys_under(prefix, self._names_under(prefix))

    def _uploads_under(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of the multipart uploads under `prefix` never completed or aborted."""
        uploads = []
        paginator = self._client.get_paginator("list_multipart_uploads")
        with self._errors(prefix):
            for page in paginator.paginate(Bucket=self._root.bucket, Prefix=self._root.list_prefix(prefix)):
                uploads.extend((item["Key"], item["UploadId"]) for item in page.get("Uploads", []))
        wanted = set(self._root.keys_under(prefix, [name for name, _ in uploads]))
        return sorted((name[len(self._root.prefix) :], upload_id) for name, upload_id in uploads
                      if name[len(self._root.prefix) :] in wanted)

    def unfinished(self, prefix: str) -> list[str]:
        """Keys of multipart uploads never completed: S3 keeps (and bills) their parts
        until they are aborted, and a killed writer never aborts its own."""
        return [key for key, _ in self._uploads_under(prefix)]

    def discard_unfinished(self, prefix: str) -> None:
        for key, upload_id in self._uploads_under(prefix):
            with self._errors(key):
                self._client.abort_multipart_upload(Bucket=self._root.bucket, Key=self._root.object_name(key), UploadId=upload_id)

    def delete_prefix(self, prefix: str) -> None:
        self.discard_unfinished(prefix)
        keys = self.list(prefix)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": self._root.object_name(key)} for key in keys[start : start + DELETE_BATCH]]
            with self._errors(prefix):
                response = self._client.delete_objects(Bucket=self._root.bucket, Delete={"Objects": batch, "Quiet": True})
            if response.get("Errors"):
                first = response["Errors"][0]
                raise StorageError(
                    f"{self.url_for(prefix)}: {len(response['Errors'])} objects not deleted, "
                    f"first {first.get('Key')!r}: {first.get('Code')} {first.get('Message', '')}"
                )
