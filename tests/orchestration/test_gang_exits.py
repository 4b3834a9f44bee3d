"""A gang's exits and lost nodes, judged by the control plane on the database alone:
a rank failing on its collective is a preemption when a peer's VM is gone and the
code's failure when no peer is left; a node found gone has the rest of its gang
stopped; late reports about a replaced gang leave the new gang alone.

The end-to-end runs of tests/e2e/test_gang.py only sometimes reach these cases (the
surviving rank's trainer may exit on the broken collective before the dead node's
heartbeat deadline, or hang until it is told to stop)."""

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Instance
from tests.factories import make_job, make_team_with_members

STEPS, NODES = 150, 2
GLOO_ERROR = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:61625: Connection reset by peer"


def test_a_rank_failing_because_its_peers_vm_vanished_counts_as_a_preemption(db, django_capture_on_commit_callbacks):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.fleet.reconciler import check_gang_failure
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    survivor = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-900-0000aaaa").instance
    vanished = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-901-0000bbbb").instance
    with django_capture_on_commit_callbacks() as queued:
        record_exit(survivor, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception=GLOO_ERROR,
                    output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    assert len(queued) == 1  # the peers are checked before the code is blamed
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RUNNING, 0)

    check_gang_failure(job.pk, f"exit 1: {GLOO_ERROR}", GLOO_ERROR)  # what the queued task runs
    job.refresh_from_db()
    vanished.refresh_from_db()
    assert vanished.end_reason == EndReason.PREEMPTED  # the local provider has no such VM: gone
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 1, 0)


def test_a_rank_failing_with_no_live_peer_left_is_the_codes_failure(db):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    make_instance(job, rank=1, state=InstanceState.ENDED, end_reason=EndReason.FENCED)
    failed = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-902-0000cccc").instance
    record_exit(failed, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception="ValueError: bad",
                output_tail="ValueError: bad", artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 0, 1)


def test_a_node_found_gone_without_a_notice_has_the_rest_of_its_gang_stopped(db, django_capture_on_commit_callbacks):
    from respawn_server.jobs.fleet.reconciler import confirm_silent
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    alive = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-903-0000dddd").instance
    silent = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-904-0000eeee").instance
    with django_capture_on_commit_callbacks():
        confirm_silent(silent)  # the heartbeat deadline passed; the cloud has no such VM
    alive.refresh_from_db()
    job.refresh_from_db()
    assert alive.requested_action == "stop"  # not checkpoint_and_stop: no collective save can succeed without rank 1
    assert (job.status, job.preemptions) == (JobStatus.RECOVERING, 1)


def test_a_late_judgement_about_a_replaced_gang_leaves_the_new_gang_alone(db, django_capture_on_commit_callbacks):
    from respawn_server.jobs.core.transitions import end_instance
    from respawn_server.jobs.fleet.reconciler import check_gang_failure
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    failed = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-905-0000ffff").instance
    end_instance(failed, EndReason.FAILED)
    for rank in range(NODES):  # the gang was replaced before the queued check ran
        make_instance(job, rank=rank, state=InstanceState.RUNNING, provider_instance_id=f"local-9{rank}6-00001111")
    with django_capture_on_commit_callbacks():
        check_gang_failure(job.pk, f"exit 1: {GLOO_ERROR}", GLOO_ERROR, failed.pk)
    job.refresh_from_db()
    assert (job.status, job.failure_restarts, job.preemptions) == (JobStatus.RUNNING, 0, 0)


def test_a_rank_failing_after_its_peer_was_found_gone_is_not_judged(db):
    """Seen in CI: the survivor's exit report (its collective broke) arrived after the
    reconciler had found the peer gone and moved the job to recovering. It was judged
    as the code's failure, an illegal recovering -> recovering move: a 500, resent
    until the survivor was marked lost."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.fleet.reconciler import confirm_silent
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    survivor = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-907-0000aaaa").instance
    vanished = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-908-0000bbbb").instance
    confirm_silent(vanished)
    record_exit(survivor, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception=GLOO_ERROR,
                output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    survivor.refresh_from_db()
    assert survivor.end_reason == EndReason.FAILED
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 1, 0)


def test_an_old_gangs_late_exit_report_leaves_the_new_gang_running(db):
    """Seen in CI: a rank's exit report, resent until after its instance had been marked
    lost and the gang relaunched, asked the new gang to stop; the new gang stopped and
    the job stayed `running` with nothing running it."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    old = make_instance(job, rank=0, state=InstanceState.ENDED, end_reason=EndReason.LOST).instance
    new = [make_instance(job, rank=rank, state=InstanceState.RUNNING).instance for rank in range(NODES)]
    record_exit(old, reason=ExitReason.FAILED, exit_code=1, final_step=40, last_exception=GLOO_ERROR,
                output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RUNNING, 0)
    assert [Instance.objects.get(pk=i.pk).requested_action for i in new] == [""] * NODES


def test_a_running_job_whose_last_node_stops_unasked_is_recovered(db):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    only = make_instance(job, state=InstanceState.RUNNING).instance
    record_exit(only, reason=ExitReason.STOPPED, exit_code=-15, final_step=None, last_exception="",
                output_tail="", artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RECOVERING, 0)


@pytest.mark.django_db(transaction=True)
def test_both_ranks_completing_at_once_succeed_the_job():
    """Each rank's exit is decided in its own transaction. Rank 1's report arrives
    while rank 0's transaction is still open: without the job's lock each saw the
    other still live and neither succeeded the job."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance
    from tests.overlap import in_overlapping_transactions

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    ranks = [make_instance(job, rank=rank, state=InstanceState.RUNNING).instance for rank in range(NODES)]

    def complete(instance):
        record_exit(instance, reason=ExitReason.COMPLETED, exit_code=0, final_step=STEPS, last_exception="",
                    output_tail="", artifact_uri="", artifact_digest="")

    in_overlapping_transactions(lambda: complete(ranks[0]), lambda: complete(ranks[1]), hold_s=2)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_judgement_waiting_while_the_gang_is_placed_again_leaves_the_new_gang_alone():
    """Seen in CI: rank 0 failed on its broken collective; before the queued check of
    its peers ran, rank 1 was found gone and the job recovered. The check saw no
    replacement yet, then waited on the job's lock while the scheduler placed the new
    gang, and judged the failure the code's against a job `provisioning` again: a
    failure restart counted and the new gang's job sent back to recovering."""
    from respawn_server.jobs.core.transitions import end_instance, transition_job
    from respawn_server.jobs.fleet.reconciler import check_gang_failure
    from tests.factories import make_instance
    from tests.overlap import in_overlapping_transactions

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RECOVERING)
    failed = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-909-0000aaaa").instance
    end_instance(failed, EndReason.FAILED)
    lost = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-910-0000bbbb").instance
    end_instance(lost, EndReason.LOST)

    def place_again():
        transition_job(job.pk, JobStatus.RECOVERING, JobStatus.PROVISIONING, message="placing 2 node(s)")
        for rank in range(NODES):
            make_instance(job, rank=rank)

    in_overlapping_transactions(place_again, lambda: check_gang_failure(job.pk, f"exit 1: {GLOO_ERROR}", GLOO_ERROR,
                                                                        failed.pk), hold_s=2)
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.PROVISIONING, 0)
