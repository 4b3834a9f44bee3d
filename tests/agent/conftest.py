"""Shared pieces for the agent tests."""

import pytest

from respawn.metadata_server import MetadataServer


@pytest.fixture
def imds():
    """An AWS-like metadata service for one agent (a module needing another cloud's, or
    several, defines its own `imds`)."""
    server = MetadataServer("aws").start()
    yield server
    server.stop()
