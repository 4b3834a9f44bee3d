"""Spares launched on a notice (docs/spares.md), in the control plane's own code on the
local provider's price book: where one goes, how it takes over or is released, and the
bad input of issue 20 (a spare that never registers, a notice for a VM already gone)."""

import datetime as dt

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.fleet.reconciler import retry_stuck_provisioning
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.recovery.after_end import after_instance_ended
from respawn_server.jobs.recovery.spares import launch_spare, promote_spares, release_stale_spares
from respawn_server.jobs.reports.checkpoints import record_checkpoint
from respawn_server.jobs.reports.exits import record_exit
from respawn_server.jobs.reports.notices import record_notice
from respawn_server.jobs.reports.registration import register_instance
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def noticed(settings, db):
    """A running one-node job whose VM (in local-a) just got a notice with a 120 s deadline."""
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], status=JobStatus.RUNNING)
    old = make_instance(job, state=InstanceState.RUNNING, zone="local-a").instance
    now = timezone.now()
    with transaction.atomic():
        record_notice(old, source="local", notice_time=now, deadline=now + dt.timedelta(seconds=120), raw="")
    old.refresh_from_db()
    return job, old


def spare_of(old) -> Instance:
    return Instance.objects.get(standby_for=old)


def test_a_notice_places_a_spare_outside_the_noticed_zone_holding_no_slot(noticed):
    job, old = noticed
    [spare_id] = launch_spare(old.pk)
    spare = Instance.objects.get(pk=spare_id)
    assert (spare.standby_for_id, spare.rank, spare.state) == (old.pk, old.rank, InstanceState.REQUESTED)
    assert spare.zone != old.zone  # the noticed zone counts as just preempted
    assert launch_spare(old.pk) == []  # a resent nudge adds none
    assert job.events.filter(message__contains=f"spare instance {spare_id} launching").exists()
    # The slot is the old instance's: the database refuses a promotion while it lives.
    with pytest.raises(IntegrityError), transaction.atomic():
        Instance.objects.filter(pk=spare_id).update(standby_for=None)


def test_the_spare_takes_over_from_the_notice_checkpoint_once_the_old_instance_ended(noticed):
    from tests.downtime.test_downtime import _checkpoint

    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    with transaction.atomic():
        register_instance(spare, hostname="spare", agent_version="t", provider_instance_id="")
    spare.refresh_from_db()
    assert spare.resume_checkpoint is None and spare.state == InstanceState.RUNNING  # nothing fixed before the save
    save = _checkpoint(old, 90, "notice", timezone.now())
    with transaction.atomic():
        record_exit(old, reason="preempted", exit_code=0, final_step=90, output_tail="", last_exception="",
                    artifact_uri="", artifact_digest="")
    spare.refresh_from_db()
    job.refresh_from_db()
    assert (spare.standby_for_id, spare.resume_checkpoint_id) == (None, save.pk)
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 1)
    assert job.events.filter(message__contains="the price of the overlap").exists()


def test_a_spare_registering_while_the_handover_reads_it_still_runs_the_job(noticed):
    """The notice save's handover read the spare as booting; its registration committed
    before the promotion wrote (it ran beside, with the job still running, so it moved
    nothing): the promotion must see the registered spare and run the job on it (CI's
    drill stuck in provisioning with its spare trained to the end)."""
    from tests.downtime.test_downtime import _checkpoint

    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    save = _checkpoint(old, 90, "notice", timezone.now())
    with transaction.atomic():
        end_instance(old, EndReason.PREEMPTED)
    read_before_register = list(Instance.objects.filter(pk=spare.pk).select_related("standby_for"))
    with transaction.atomic():
        register_instance(spare, hostname="spare", agent_version="t", provider_instance_id="")
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    with transaction.atomic():
        promote_spares(job, read_before_register)
    job.refresh_from_db()
    spare.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert (spare.standby_for_id, spare.resume_checkpoint_id, spare.last_step) == (None, save.pk, 90)


@pytest.mark.django_db(transaction=True)
def test_a_spare_mid_registration_as_it_is_promoted_resumes_from_the_notice_save(noticed):
    """The spare's register had locked its row and read it standing by (no resume point
    fixed) when the promotion wrote: the promotion must wait for it and give it the
    notice save, not skip it as still booting (CI's drill: a spare trained with none)."""
    from tests.downtime.test_downtime import _checkpoint
    from tests.overlap import in_overlapping_transactions

    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    Instance.objects.filter(pk=spare.pk).update(state=InstanceState.BOOTING)
    save = _checkpoint(old, 90, "notice", timezone.now())
    with transaction.atomic():
        end_instance(old, EndReason.PREEMPTED)

    def register():
        register_instance(Instance.objects.select_for_update().get(pk=spare.pk), hostname="spare", agent_version="t",
                          provider_instance_id="")

    def promote():
        with transaction.atomic():
            spares = Instance.objects.filter(pk=spare.pk).select_related("standby_for")
            promote_spares(Job.objects.get(pk=job.pk), list(spares))

    in_overlapping_transactions(register, promote, hold_s=2)
    spare.refresh_from_db()
    assert (spare.state, spare.standby_for_id, spare.resume_checkpoint_id, spare.last_step) == \
        (InstanceState.RUNNING, None, save.pk, 90)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_false_notice_releases_the_spare_and_says_what_the_overlap_cost(noticed):
    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    assert release_stale_spares() == 0  # within its deadline
    old.interruptions.update(deadline=timezone.now() - dt.timedelta(hours=1))  # the VM outlived it
    assert release_stale_spares() == 1
    spare.refresh_from_db()
    assert (spare.state, spare.end_reason) == (InstanceState.ENDED, EndReason.FENCED)
    released = job.events.get(message__contains=f"spare instance {spare.pk} released")
    assert "a false notice" in released.message and "the price of the overlap" in released.message
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
    old.refresh_from_db()
    assert old.state == InstanceState.PREEMPTING  # it keeps its slot


def test_a_spare_that_never_registers_fails_on_its_boot_deadline_and_the_job_goes_on(noticed, settings):
    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    Instance.objects.filter(pk=spare.pk).update(requested_at=timezone.now() - dt.timedelta(hours=1))
    retry_stuck_provisioning()
    spare.refresh_from_db()
    job.refresh_from_db()
    assert (spare.state, spare.end_reason) == (InstanceState.ENDED, EndReason.CAPACITY_ERROR)
    assert job.status == JobStatus.RUNNING  # its old instance still runs: nothing to recover yet
    assert job.events.filter(message__contains=f"spare instance {spare.pk} ended capacity_error").exists()
    old.refresh_from_db()
    assert old.requested_action == Action.CHECKPOINT_AND_STOP  # no spare is coming: it saves now
    # When the old instance then ends, the job recovers as without a spare.
    with transaction.atomic():
        end_instance(old, EndReason.PREEMPTED)
        after_instance_ended(job.pk, EndReason.PREEMPTED, instance_id=old.pk)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RECOVERING


def test_a_notice_for_a_vm_already_gone_is_ignored_with_a_reason(noticed):
    job, old = noticed
    with transaction.atomic():
        end_instance(old, EndReason.PREEMPTED)
    assert launch_spare(old.pk) == []
    assert not Instance.objects.filter(standby_for=old).exists()
    assert job.events.filter(message__contains=f"no spare for instance {old.pk}: its VM had already ended").exists()
    now = timezone.now()
    with transaction.atomic():
        assert record_notice(old, source="local", notice_time=now, deadline=now, raw="") is None
    assert job.events.filter(message__contains=f"instance {old.pk} ignored: the instance had already ended").exists()


def test_the_notice_save_s_commit_hands_the_slot_over_before_the_old_agent_s_exit(noticed,
                                                                                   django_capture_on_commit_callbacks):
    import uuid

    job, old = noticed
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    with transaction.atomic():
        register_instance(spare, hostname="spare", agent_version="t", provider_instance_id="")
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        save, _ = record_checkpoint(old, checkpoint_id=uuid.uuid4(), step=90, uri="/c/90", bytes=1,
                                    manifest_digest="d", kind="notice", committed_at=timezone.now())
    old.refresh_from_db()
    spare.refresh_from_db()
    assert (old.state, old.end_reason) == (InstanceState.ENDED, EndReason.PREEMPTED)
    assert (spare.standby_for_id, spare.resume_checkpoint_id) == (None, save.pk)
    # Its agent's exit report, coming after, is taken and changes nothing.
    with transaction.atomic():
        record_exit(old, reason="preempted", exit_code=0, final_step=90, output_tail="", last_exception="",
                    artifact_uri="", artifact_digest="")
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
