"""Storage emulators on 127.0.0.1, started once per test session, and a `storage`
fixture that opens a fresh bucket on each backend through `open_storage(uri)`.

An emulator that cannot start fails the session's storage tests (an error, not a
skip). Azurite comes from npm: `npm ci --prefix tests/emulators`.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

BACKENDS = ["local", "s3", "gcs", "azure"]
CLOUD_BACKENDS = BACKENDS[1:]

# Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_BIN = Path(__file__).resolve().parents[1] / "emulators" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_READY = re.compile(r"listens on (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def gcs_endpoint():
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    _host, port = server._api._httpd.server_address  # the emulator has no public accessor for a port-0 bind
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def azurite_connection_string(tmp_path_factory):
    if not AZURITE_BIN.exists():
        pytest.fail(f"Azurite is not installed at {AZURITE_BIN}: run `npm ci --prefix tests/emulators`")
    process = subprocess.Popen(
        [str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", str(tmp_path_factory.mktemp("azurite")),
         "--silent", "--skipApiVersionCheck"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    endpoint = _wait_for_line(process, AZURITE_READY)
    yield (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )
    process.kill()  # a throwaway emulator: SIGTERM waits on idle keep-alive connections
    process.wait()


def _wait_for_line(process: subprocess.Popen, pattern: re.Pattern) -> str:
    """The first match of `pattern` in the process's output; fails the session if
    the process exits or stays silent (its output is then in the failure)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen = []
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            process.kill()
            pytest.fail(f"emulator did not report readiness within {START_TIMEOUT_S}s; output: {''.join(seen)}")
        if line is None:
            pytest.fail(f"emulator exited with {process.wait()}; output: {''.join(seen)}")
        seen.append(line)
        if match := pattern.search(line):
            return match.group(1)


def new_bucket_name() -> str:
    return f"ckpt-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def s3_env(monkeypatch, moto_endpoint):
    """boto3's standard environment pointed at moto, isolated from any real profile."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return moto_endpoint


@pytest.fixture
def gcs_env(monkeypatch, gcs_endpoint):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "respawn-test")
    return gcs_endpoint


@pytest.fixture
def azure_env(monkeypatch, azurite_connection_string):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_URL", raising=False)
    return azurite_connection_string


def create_bucket(backend: str, name: str) -> None:
    """Make a bucket with the SDK directly, as an operator would beforehand."""
    if backend == "s3":
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
    elif backend == "gcs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(project="respawn-test", credentials=AnonymousCredentials()).create_bucket(name)
    elif backend == "azure":
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)


SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


@pytest.fixture
def cloud_uri(request):
    """A root URI in a fresh bucket of the backend named by the test's `backend`
    parameter, with that backend's environment set."""
    backend = request.getfixturevalue("backend")
    request.getfixturevalue(f"{backend}_env")
    bucket = new_bucket_name()
    create_bucket(backend, bucket)
    return f"{SCHEMES[backend]}://{bucket}/runs/r1"


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def storage(backend, request, tmp_path):
    from respawn.checkpoint.storage import open_storage

    if backend == "local":
        return open_storage(str(tmp_path / "ckpt"))
    return open_storage(request.getfixturevalue("cloud_uri"))
