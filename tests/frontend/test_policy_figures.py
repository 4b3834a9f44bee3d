"""The job page explains the checkpoint interval in words, with its inputs; the team overview
shows the interruption-rate estimates placement uses."""

from datetime import timedelta

from django.test import Client
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.fleet.placement import interval_for
from respawn_server.jobs.models import Instance, InterruptionEvent
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


def test_job_page_shows_the_interval_and_team_page_the_rates(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    AgentClient().register(make_instance(job, zone="local-a").bootstrap_token)
    old = make_instance(job, rank=1, zone="local-b", state=InstanceState.RUNNING).instance
    Instance.objects.filter(pk=old.pk).update(running_at=timezone.now() - timedelta(hours=3))
    old.refresh_from_db()
    end_instance(old, EndReason.PREEMPTED)
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    interval = page[page.index('id="interval">'):].split("</p>")[0]
    # In words, not M = 19681817 s: the interval, the measured cost and the interruptions where it runs.
    assert "Checkpoints every 20 min: measured save cost " in interval, interval
    assert "mean time between interruptions without a notice ~" in interval and "on spot in local-a" in interval
    assert "the longest allowed; Young/Daly gave " in interval and "M =" not in interval
    team = browser.get(f"/teams/{setup.team.pk}/").content.decode()
    assert "Estimated interruption rates" in team and "local-b" in team


def test_three_preemptions_in_two_minutes_show_as_three_and_set_the_interval(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, checkpoint_interval_s=None)
    start = timezone.now() - timedelta(minutes=2)
    for n in range(3):  # three 40 s VMs in local-b, each preempted after a notice it saved a checkpoint for
        vm = make_instance(job, zone="local-b", state=InstanceState.RUNNING).instance
        Instance.objects.filter(pk=vm.pk).update(running_at=start + timedelta(seconds=40 * n))
        InterruptionEvent.objects.create(instance=vm, kind="notice", source="local", checkpoint_saved=True)
        vm.refresh_from_db()
        end_instance(vm, EndReason.PREEMPTED)
        Instance.objects.filter(pk=vm.pk).update(ended_at=start + timedelta(seconds=40 * (n + 1)),
                                                 preemption_confirmed=True)  # the cloud said so
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/teams/{setup.team.pk}/").content.decode()
    interruptions = page[page.index('id="interruptions-table"'):page.index('id="h-rates"')]
    assert interruptions.count("<tr>") == 2 and "preempted" in interruptions and "notice" not in interruptions
    assert '<td class="num">3</td>' in interruptions  # one preemption, one interruption
    rates = page[page.index('id="rates-table"'):]
    row = rates[rates.index("local-b"):]
    per_hour = float(row[row.index('data-field="per-hour">') + 22:].split("<")[0])
    assert per_hour > 10  # three an instance-minute or so, not the bucket's one a month
    assert "2 min 0 s" in row  # the exposure, not "0.0 instance-hours"
    assert "–" in row[row.index('data-field="credible">'):].split("</td>")[0]
    # The checkpoint interval of the next VM there works from that rate: minutes between
    # interruptions, not months.
    nxt = make_instance(job, zone="local-b", state=InstanceState.RUNNING).instance
    decision = interval_for(nxt)
    assert decision.unnoticed_mtbi_s < 3600 and decision.seconds < 120  # was 1200, the maximum, from M = 227 days
