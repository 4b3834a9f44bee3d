"""The team queue: priorities, GPU limits, and fairness between busy teams over
simulated hours (placement on the local provider's price book)."""

import re

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.fleet.launcher import launch
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Instance, Job, Team
from tests.factories import make_job, make_team_with_members


@pytest.fixture
def local_only(settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    return settings


def simulate_day(teams: list[Team], owner, hours: int = 12) -> dict[int, int]:
    """Each team keeps 40 one-GPU, one-hour jobs queued (more than it can run); every hour the running
    ones finish and the scheduler fills the freed GPUs. Returns GPU-hours per team."""
    for team in teams:
        for i in range(40):
            make_job(team, owner, name=f"{team.name}-{i}", allowed_clouds=["local"])
    gpu_hours = {team.pk: 0 for team in teams}
    for _ in range(hours):
        schedule()
        for instance in Instance.objects.filter(state__in=InstanceState.LIVE).select_related("job"):
            gpu_hours[instance.job.team_id] += 1
            end_instance(instance, EndReason.COMPLETED)
            Job.objects.filter(pk=instance.job_id).update(status=JobStatus.SUCCEEDED)
    return gpu_hours


def test_two_equally_entitled_busy_teams_share_the_deployment_evenly(local_only, db):
    local_only.RESPAWN = {**local_only.RESPAWN, "MAX_CONCURRENT_GPUS": 4}
    a, b = make_team_with_members("a"), make_team_with_members("b")
    for setup in (a, b):
        Team.objects.filter(pk=setup.team.pk).update(max_concurrent_gpus=4)
    hours = simulate_day([Team.objects.get(pk=a.team.pk), Team.objects.get(pk=b.team.pk)], a.people["admin"].user)
    total = sum(hours.values())
    assert total == 4 * 12  # the deployment never idles while work waits
    assert abs(hours[a.team.pk] / total - 0.5) <= 0.05


def test_shares_follow_each_teams_allowance(local_only, db):
    local_only.RESPAWN = {**local_only.RESPAWN, "MAX_CONCURRENT_GPUS": 4}
    a, b = make_team_with_members("big"), make_team_with_members("small")
    Team.objects.filter(pk=a.team.pk).update(max_concurrent_gpus=6)
    Team.objects.filter(pk=b.team.pk).update(max_concurrent_gpus=2)
    hours = simulate_day([Team.objects.get(pk=a.team.pk), Team.objects.get(pk=b.team.pk)], a.people["admin"].user)
    assert abs(hours[a.team.pk] / sum(hours.values()) - 0.75) <= 0.05


def test_higher_priority_starts_first_within_a_team(local_only, db):
    setup = make_team_with_members()
    Team.objects.filter(pk=setup.team.pk).update(max_concurrent_gpus=1)
    old = make_job(setup.team, setup.people["member"].user, name="old", allowed_clouds=["local"])
    urgent = make_job(setup.team, setup.people["member"].user, name="urgent", priority=5, allowed_clouds=["local"])
    schedule()
    assert Job.objects.get(pk=urgent.pk).status == JobStatus.PROVISIONING
    assert "team GPU limit" in Job.objects.get(pk=old.pk).status_reason


def test_a_job_no_placement_fits_waits_with_its_reason(local_only, db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], max_price_per_hour="0.01")
    schedule()
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and "no placement" in job.status_reason


def test_on_demand_after_n_preemptions(local_only, db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], on_demand_after_preemptions=2,
                   preemptions=2)
    schedule()
    instance = Instance.objects.get(job=job)
    # The price book prices local on-demand region-wide: the VM goes to a zone the provider has.
    assert (instance.market, instance.zone) == ("on_demand", "local-a")


def test_a_launch_refused_for_a_zone_respawn_chose_is_not_blamed_on_the_jobs_spec(local_only, db, tmp_path):
    local_only.RESPAWN = {**local_only.RESPAWN, "PROVIDER_CONFIG": {
        **local_only.RESPAWN["PROVIDER_CONFIG"], "local": {"root": str(tmp_path / "vms")}}}
    provider_for.cache_clear()
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"])
    schedule()
    Instance.objects.filter(job=job).update(zone="local")  # what the price book's region-wide quote gave before
    launch(Instance.objects.get(job=job).pk)
    provider_for.cache_clear()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == "controller"
    assert "not your job's spec" in job.failure_message


def test_every_waiting_job_says_why_and_when_it_is_tried_again(local_only, db):
    setup = make_team_with_members()
    Team.objects.filter(pk=setup.team.pk).update(max_concurrent_gpus=0)
    held = make_job(setup.team, setup.people["member"].user, name="held", allowed_clouds=["local"])
    other = make_team_with_members("other")
    priced_out = make_job(other.team, other.people["member"].user, allowed_clouds=["local"], max_price_per_hour="0.01")
    schedule()
    for job in (held, priced_out):
        job.refresh_from_db()
        assert job.status == JobStatus.QUEUED and re.search(r"; next try at \d\d:\d\d:\d\d UTC$", job.status_reason), \
            job.status_reason
