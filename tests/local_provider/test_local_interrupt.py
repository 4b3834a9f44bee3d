"""LocalProvider.interrupt, a drill on a local VM: with a notice the supervisor serves the
market's notice at once (the IMDS instance-action, then the kill at its deadline); without
one the VM is reclaimed at once."""

import json
import urllib.error
import urllib.request

import pytest

from respawn_server.jobs.fleet.providers.base import CloudState, PrecheckError
from tests.conftest import wait_until
from tests.local_provider.helpers import launch_request


@pytest.fixture
def local(local_provider):
    return local_provider(notice_lead_s=30.0)


def launch(local):
    return local.launch(launch_request(11))


def instance_action(local, vm_id):
    url = local.vm_dir(vm_id).metadata_url_file.read_text()
    token = urllib.request.urlopen(urllib.request.Request(f"{url}/latest/api/token", method="PUT", headers={
        "X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=5).read().decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/latest/meta-data/spot/instance-action", headers={
                "X-aws-ec2-metadata-token": token}), timeout=5) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def test_with_notice_the_market_serves_its_notice_now_and_the_vm_lives_until_the_deadline(local):
    vm_id = launch(local)
    wait_until(lambda: local.vm_dir(vm_id).metadata_url_file.exists(), timeout=30, what="the VM to boot")
    assert instance_action(local, vm_id) is None

    local.interrupt(vm_id, with_notice=True)

    wait_until(lambda: instance_action(local, vm_id) is not None, timeout=10, what="the notice")
    assert instance_action(local, vm_id)["action"] == "terminate"
    assert local.describe(vm_id).state == CloudState.RUNNING  # 30 s of notice before the reclaim


def test_without_notice_the_vm_is_reclaimed_at_once(local):
    vm_id = launch(local)
    wait_until(lambda: local.vm_dir(vm_id).metadata_url_file.exists(), timeout=30, what="the VM to boot")

    local.interrupt(vm_id, with_notice=False)

    wait_until(lambda: local.describe(vm_id).state == CloudState.GONE, timeout=10, what="the reclaim")
    assert local.vm_dir(vm_id).ended()["reason"] == "preempted"
    assert not local.processes(vm_id)


def test_a_vm_that_is_gone_cannot_be_drilled(local):
    vm_id = launch(local)
    local.terminate_all()
    with pytest.raises(PrecheckError, match="not running"):
        local.interrupt(vm_id, with_notice=True)
