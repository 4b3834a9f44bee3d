import pytest

from tests.chaos import stack
from tests.conftest import WebServer


@pytest.fixture(scope="session")
def uninterrupted_digest(tmp_path_factory):
    """The exported weights of the chaos tests' training when nothing goes wrong (computed once)."""
    return stack.reference_digest(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture
def broker_url(child_env):
    """The Celery broker of every process of the test (a test module may bring its own)."""
    return child_env["CELERY_BROKER_URL"]


@pytest.fixture
def chaos_env(child_env, broker_url):
    return {**child_env, **stack.STACK_ENV, "CELERY_BROKER_URL": broker_url}


@pytest.fixture
def chaos_web(chaos_env, tmp_path):
    """The web process, on the chaos tests' heartbeat timeout (it sets the deadlines)."""
    server = WebServer(chaos_env, tmp_path / "web.log").start()
    yield server
    server.stop()


@pytest.fixture
def stack_env(chaos_env, chaos_web):
    """Environment of the worker, beat and VMs of a chaos test, talking to `chaos_web`."""
    return {**chaos_env, "RESPAWN_API_URL": chaos_web.url}
