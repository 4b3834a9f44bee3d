"""get_provider: providers by name, configured by keyword."""

from __future__ import annotations

import pytest

from respawn_server.jobs.fleet.providers import get_provider
from respawn_server.jobs.fleet.providers.aws import AwsCredentials, AwsProvider
from respawn_server.jobs.fleet.providers.base import CloudState


def test_it_builds_a_configured_provider_that_works(moto_url, moto):
    creds = AwsCredentials(access_key_id="testing", secret_access_key="testing")
    aws = get_provider("aws", region="us-east-1", endpoint_url=moto_url, credentials=creds)

    assert isinstance(aws, AwsProvider)
    assert aws.describe("i-0123456789abcdef0").state == CloudState.GONE


def test_it_names_an_unknown_provider_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown provider 'ibm'.*aws, azure, gcp"):
        get_provider("ibm")


def test_it_names_a_misspelt_config_field():
    with pytest.raises(ValueError, match=r"provider 'aws'.*regoin"):
        get_provider("aws", regoin="us-east-1")


def test_it_passes_config_validation_errors_through():
    with pytest.raises(ValueError, match="eviction_policy"):
        get_provider("azure", subscription_id="s", resource_group="rg", subnet_id="x", ssh_public_key="k", eviction_policy="Stop")
