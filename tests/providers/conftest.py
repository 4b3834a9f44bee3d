"""Shared pieces for the provider tests: one moto server for the whole session
(its first EC2 call costs seconds), reset between tests."""

from __future__ import annotations

import logging

import pytest
import requests

from tests.providers.helpers import MotoRecorder


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory):
    from moto import moto_api
    from moto import settings as moto_settings
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per call otherwise
    with pytest.MonkeyPatch.context() as patch:
        # Real errors for unknown AMIs and instance types instead of moto's silent
        # acceptance. moto reads its MOTO_* variables once, at import, and another
        # test may have imported it already: set the values it reads at call time.
        patch.setattr(moto_settings, "EC2_ENABLE_INSTANCE_TYPE_VALIDATION", True)
        patch.setattr(moto_settings, "ENABLE_AMI_VALIDATION", True)
        # The recorder writes to ./moto_recording unless told otherwise, so every xdist
        # worker's server shared one file and one worker's reset emptied another's
        # recording mid-test. It too reads its variable at import: give this server its own.
        patch.setattr(moto_api.recorder, "_location", str(tmp_path_factory.mktemp("moto") / "recording"))
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()


@pytest.fixture
def moto(moto_url):
    requests.post(f"{moto_url}/moto-api/reset", timeout=60).raise_for_status()
    recorder = MotoRecorder(moto_url)
    recorder.start()
    yield recorder
    requests.post(f"{moto_url}/moto-api/recorder/stop-recording", timeout=60)
