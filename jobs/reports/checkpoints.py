"""Checkpoints an agent reports committed, and the validators' verdicts on them."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Greatest
from django.utils import timezone

from respawn.protocol import Action, CheckpointKind, ValidationResult
from respawn_server.jobs.core.choices import InstanceState, InterruptionKind
from respawn_server.jobs.core.signals import checkpoint_invalid
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job
from respawn_server.jobs.recovery.after_end import hand_over_to_spares
from respawn_server.jobs.recovery.gangs import live_joiners
from respawn_server.jobs.recovery.joiners import grow_with_joiners


def unvalidated_reason(job: Job) -> str:
    """Why no checkpoint of `job` can be validated (DESIGN §11 `skipped`), or "" when they can."""
    if not job.validation_enabled:
        return "not validated: validation is off for this job"
    if not (job.validation_model_factory and job.validation_batch_factory):
        return "not validated: the job names no validation model and batch factories to check it with"
    return ""


def record_checkpoint(instance: Instance, **fields) -> tuple[Checkpoint, bool]:
    """The checkpoint with this report's `checkpoint_id`, and whether it is new (else it
    was recorded before, maybe with other fields: the caller judges a resend). A new one
    changes the job's measured checkpoint cost: its caller refreshes the instance's interval."""
    # Recorded `skipped` at once when nothing will ever validate it, rather than `pending` forever.
    skipped = unvalidated_reason(instance.job)
    verdict = {"validation": ValidationResult.SKIPPED, "validation_message": skipped} if skipped else {}
    checkpoint_id = fields.pop("checkpoint_id")
    checkpoint, created = Checkpoint.objects.get_or_create(
        checkpoint_id=checkpoint_id, defaults={"job_id": instance.job_id, "instance": instance, **verdict, **fields})
    if not created:
        return checkpoint, False
    # A checkpoint of step N proves its VM trained to N: the curve's mark of the VM's end sits
    # at its notice save, not at the last heartbeat before it (one comes every 10 s).
    Instance.objects.filter(pk=instance.pk).update(last_step=Greatest("last_step", checkpoint.step))
    job = Job.objects.select_for_update(of=("self",)).select_related("newest_checkpoint").get(pk=instance.job_id)
    if job.newest_checkpoint is None or checkpoint.step >= job.newest_checkpoint.step:
        Job.objects.filter(pk=job.pk).update(newest_checkpoint=checkpoint)
    if checkpoint.kind == CheckpointKind.NOTICE:
        # In a gang, rank 0 commits the notice save of whichever node got the notice, and its
        # report may arrive after rank 0 itself has ended (lost to a heartbeat timeout under
        # load). An ended instance's save answers only notices received before it ended (the
        # control plane's clocks, not the VM's word): a fenced VM's late report never answers
        # its replacement's notice.
        notices = InterruptionEvent.objects.filter(instance__job_id=instance.job_id, kind=InterruptionKind.NOTICE,
                                                   checkpoint_saved__isnull=True)
        if instance.state == InstanceState.ENDED:
            notices = notices.filter(received_at__lte=instance.ended_at)
        notice = notices.last()
        if notice is not None:
            notice.checkpoint_saved = notice.deadline is None or checkpoint.committed_at <= notice.deadline
            notice.save(update_fields=["checkpoint_saved"])
        # After this transaction, whose job row lock must not be held while the job's endings are locked.
        transaction.on_commit(lambda: hand_over_to_spares(instance.pk))
    if instance.requested_action == Action.CHECKPOINT:
        Instance.objects.filter(pk=instance.pk, requested_action=Action.CHECKPOINT).update(requested_action="")
    if live_joiners(job.pk).exists():
        # After this transaction too: the regroup writes the nodes' rows before the job's.
        transaction.on_commit(lambda: grow_with_joiners(job.pk))
    return checkpoint, True


def expire_pending_validations(now, batch: int) -> int:
    """Checkpoints no validator will ever judge are recorded `skipped`, saying why, rather
    than `pending` forever: their VM ended and its grace window for reports has passed (a
    VM stops validating at a notice; a resume validates only the checkpoint it loads). A
    verdict that still comes later replaces this one. Returns how many were recorded."""
    cutoff = now - timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"])
    stale = list(Checkpoint.objects.filter(validation=ValidationResult.PENDING, instance__state=InstanceState.ENDED,
                                           instance__ended_at__lt=cutoff).values_list("pk", flat=True)[:batch])
    return Checkpoint.objects.filter(pk__in=stale, validation=ValidationResult.PENDING).update(
        validation=ValidationResult.SKIPPED, validated_at=now,
        validation_message="not validated: its VM ended before a verdict came (a notice stops the VM's validator; "
                           "a resume validates the checkpoint it loads)")


def record_validation(checkpoint: Checkpoint, *, result: str, loss, message: str) -> None:
    checkpoint.validation = result
    checkpoint.validation_loss = loss
    checkpoint.validation_message = message[:500]
    checkpoint.validated_at = timezone.now()
    checkpoint.save(update_fields=["validation", "validation_loss", "validation_message", "validated_at"])
    if result == ValidationResult.VALID:
        job = Job.objects.select_for_update(of=("self",)).select_related("newest_valid_checkpoint").get(pk=checkpoint.job_id)
        if job.newest_valid_checkpoint is None or checkpoint.step >= job.newest_valid_checkpoint.step:
            Job.objects.filter(pk=job.pk).update(newest_valid_checkpoint=checkpoint)
    elif result == ValidationResult.INVALID:
        log_job_event(checkpoint.job_id, f"checkpoint at step {checkpoint.step} failed validation: {message}")
        checkpoint_invalid.send(sender=Checkpoint, checkpoint=checkpoint)
    elif result == ValidationResult.ERROR:
        log_job_event(checkpoint.job_id, f"checkpoint at step {checkpoint.step} could not be validated "
                                         f"(the check itself failed; the checkpoint is kept): {message}")
