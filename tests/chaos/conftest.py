import pytest

from tests.chaos import stack
from tests.conftest import WebServer


@pytest.fixture(scope="session")
def uninterrupted_digest(tmp_path_factory):
    """The exported weights of the chaos tests' training when nothing goes wrong (computed once)."""
    return stack.reference_digest(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture
def chaos_web(child_env, tmp_path):
    """The web process, on the chaos tests' heartbeat timeout (it sets the deadlines)."""
    server = WebServer({**child_env, **stack.STACK_ENV}, tmp_path / "web.log").start()
    yield server
    server.stop()


@pytest.fixture
def stack_env(child_env, chaos_web):
    """Environment of the worker, beat and VMs of a chaos test, talking to `chaos_web`."""
    return {**child_env, **stack.STACK_ENV, "RESPAWN_API_URL": chaos_web.url}
