import pytest

from tests.notify.receiver import Receiver


@pytest.fixture
def allow_private(settings):
    """The test receiver listens on 127.0.0.1, which deployments refuse by default."""
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}


@pytest.fixture
def receiver():
    with Receiver(slow_s=3.0) as running:
        yield running
