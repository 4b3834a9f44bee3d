"""A noticed VM's state handed straight to its spare (docs/memory-tier.md, issue 37): a
spare of a job with the memory tier runs a store while it stands by and says where
(`record`); the VM it stands by for, told to save and stop once the spares are ready, is
told that store too (`for_instance`), and its notice save goes there beside the storage
write. The spare resumes from it, verified, faster than from storage and even when
storage's write missed the window.

The store's token is derived here, never stored: the spare reads it in its job spec, the
noticed VM in the heartbeat answer that stops it, each over its own agent's channel."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max
from django.utils.crypto import salted_hmac

from respawn import protocol
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.models import Instance, StepPoint
from respawn_server.jobs.recovery.elastic import kept_in_memory, memory_claim_believed


def wants_handover(instance: Instance) -> bool:
    """A training spare of a job that asked for the memory tier."""
    return (instance.standby_for_id is not None and instance.purpose == protocol.Purpose.TRAIN
            and instance.job.env.get(protocol.ENV_MEMORY_TIER) == "on")


def token_for(spare_id: int) -> str:
    return salted_hmac("respawn.handover", str(spare_id), algorithm="sha256").hexdigest()


def record(spare: Instance, address: str) -> None:
    Instance.objects.filter(pk=spare.pk).update(handover_address=address)


def for_instance(instance: Instance) -> dict | None:
    """Where `instance` hands its notice save: its live spare's store, once the spare said
    where it listens; None otherwise."""
    spare = Instance.objects.filter(standby_for_id=instance.pk, state__in=InstanceState.LIVE) \
        .exclude(handover_address="").values_list("pk", "handover_address").first()
    if spare is None:
        return None
    return {"address": spare[1], "token": token_for(spare[0]), "node": instance.rank}


def resumed_from_memory(spare: Instance, *, step: int) -> None:
    """A promoted spare's trainer says (a heartbeat's memory_resume_step) that it resumed at
    `step` from its store, which its noticed VM handed its notice save to: newer than the
    checkpoint its promotion named (storage's write missed the window). Believed only
    between that checkpoint's step and the furthest step the noticed VM was seen to reach
    (its heartbeats and reported steps), and recorded once: the spare's run goes on from
    `step`, so the money counts the noticed VM's work kept up to it, and the page says
    where the job went on from. A claim outside those bounds is logged, and the work
    counts to the checkpoint in storage."""
    row = Instance.objects.filter(pk=spare.pk, memory_resume_step__isnull=True).exclude(handover_address="") \
        .select_related("resume_checkpoint").first()
    if row is None:
        return  # recorded already
    noticed = Instance.objects.filter(job_id=row.job_id, rank=row.rank, pk__lt=row.pk, purpose=protocol.Purpose.TRAIN) \
        .order_by("-pk").first()
    named = row.resume_checkpoint.step if row.resume_checkpoint else 0
    reached = max(noticed.last_step, StepPoint.objects.filter(instance=noticed).aggregate(top=Max("step"))["top"] or 0) \
        if noticed else 0
    if not memory_claim_believed(row.job_id, f"instance {row.pk} says it resumed at step {step} from the memory tier",
                                 step, named, reached, "its noticed VM"):
        return
    with transaction.atomic():  # a heartbeat's apply runs in none: the record, the count and the event go together
        if not Instance.objects.filter(pk=row.pk, memory_resume_step__isnull=True).update(memory_resume_step=step):
            return  # another heartbeat recorded it
        corrected = kept_in_memory(noticed.pk, step - named)
        log_job_event(row.job_id, f"spare instance {row.pk} resumed at step {step} from the memory tier (instance "
                                  f"{noticed.pk}'s notice save, handed over), {step - named} step(s) newer than the "
                                  f"checkpoint in storage (step {named}){corrected}")
