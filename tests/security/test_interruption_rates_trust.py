"""The interruption rates every team's placement shares learn only from what the cloud
confirmed, and nobody reads another team's usage from them (issue 16, item 3). The
cloud is the Azure ARM emulator, driven through the real azure-mgmt-compute client."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.fleet.instances import bootstrap_token_for
from respawn_server.jobs.fleet.leftovers import CLAIM_WAIT, confirm_claimed_preemptions, reap_orphans
from respawn_server.jobs.fleet.placement import placement_events
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_person, make_team_with_members
from tests.orchestration.test_azure_stopped_disk import arm, azure, launched_spot  # noqa: F401  (fixtures)


def rates(user) -> list[dict]:
    client = APIClient()
    client.force_authenticate(user)
    response = client.get("/api/v1/interruption-rates/")
    assert response.status_code == 200, response.content
    return response.json()


def row_of(user, instance) -> dict:
    return next(r for r in rates(user) if (r["provider"], r["zone"], r["instance_type"]) ==
                (instance.provider, instance.zone, instance.instance_type))


def running_for_hours(instance, hours: float) -> Instance:
    agent = AgentClient()
    assert agent.register(bootstrap_token_for(instance)).status_code == 200
    assert Instance.objects.get(pk=instance.pk).provider_instance_id == instance.provider_instance_id, \
        "the VM id the cloud gave at launch, not the agent's word, is the one asked about"
    Instance.objects.filter(pk=instance.pk).update(running_at=timezone.now() - timedelta(hours=hours))
    instance.refresh_from_db()
    instance.agent = agent
    return instance


def exits_preempted(instance) -> None:
    assert instance.agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=143)).status_code == 200


def test_an_agents_word_that_it_was_preempted_moves_no_shared_estimate(azure):
    instance = running_for_hours(launched_spot(), 2)
    member = instance.job.owner
    before = row_of(member, instance)

    exits_preempted(instance)  # but the cloud runs it still
    assert confirm_claimed_preemptions() == 0  # the cloud may yet take it: asked again later
    assert reap_orphans() == 0, "kept while the cloud may still take it: its absence is the cloud's word"
    Instance.objects.filter(pk=instance.pk).update(ended_at=timezone.now() - CLAIM_WAIT)
    assert confirm_claimed_preemptions() == 1

    instance.refresh_from_db()
    assert instance.preemption_confirmed is False
    after = row_of(member, instance)
    assert after["events"] == 0 and after["per_hour"] == pytest.approx(before["per_hour"], rel=0.1)
    assert not placement_events(timezone.now()), "no zone on back-off for every team on one VM's word"
    assert reap_orphans() == 1  # now terminated
    assert "not counted in the interruption rates" in instance.job.events.last().message


def test_a_preemption_the_cloud_confirms_is_counted(azure):
    instance = running_for_hours(launched_spot(), 2)
    member = instance.job.owner
    before = row_of(member, instance)
    azure.evict(instance.provider_instance_id)
    exits_preempted(instance)

    assert confirm_claimed_preemptions() == 1
    instance.refresh_from_db()
    assert instance.preemption_confirmed is True
    after = row_of(member, instance)
    assert after["events"] == 1 and after["per_hour"] > 2 * before["per_hour"]
    assert [e.kind for e in placement_events(timezone.now())] == ["preempted"]


@pytest.fixture
def two_teams(settings, db):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    ours, theirs = make_team_with_members("ours"), make_team_with_members("theirs")
    for team, zone, hours in ((theirs, "local-a", 5), (theirs, "local-private", 3), (ours, "local-a", 1)):
        job = make_job(team.team, team.people["member"].user)
        vm = make_instance(job, zone=zone, state=InstanceState.RUNNING).instance
        Instance.objects.filter(pk=vm.pk).update(running_at=timezone.now() - timedelta(hours=hours))
    return ours, theirs


def test_a_person_in_no_team_reads_no_rates(two_teams):
    loner = make_person("loner")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {loner.token}")
    assert client.get("/api/v1/interruption-rates/").status_code == 403


def test_rates_show_a_team_its_own_usage_only(two_teams):
    ours, theirs = two_teams
    mine = {r["zone"]: r for r in rates(ours.people["viewer"].user) if r["provider"] == "local"}
    assert mine["local-a"]["exposure_hours"] == pytest.approx(1, rel=0.01)
    assert "local-private" not in mine, "a placement only another team used, and no price lists, stays theirs"
    assert sum(r["exposure_hours"] for r in mine.values()) == pytest.approx(1, rel=0.01)
    others = {r["zone"]: r for r in rates(theirs.people["viewer"].user) if r["provider"] == "local"}
    assert others["local-a"]["exposure_hours"] == pytest.approx(5, rel=0.01)
    assert others["local-private"]["exposure_hours"] == pytest.approx(3, rel=0.01)
    # The estimate itself is the pooled one placement uses for everybody.
    assert mine["local-a"]["per_hour"] == pytest.approx(others["local-a"]["per_hour"], rel=1e-4)


def test_the_team_page_shows_the_teams_own_usage_only(two_teams):
    ours, _ = two_teams
    browser = Client()
    browser.force_login(User.objects.get(username="ours-viewer"))
    page = browser.get(f"/teams/{ours.team.pk}/").content.decode()
    table = page[page.index('id="rates-table"'):]
    assert "local-private" not in table
    row = table[table.index("local-a"):]
    assert row[row.index('data-field="exposure">'):].startswith('data-field="exposure">1 h')
