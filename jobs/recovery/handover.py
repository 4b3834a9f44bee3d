"""A noticed VM's state handed straight to its spare (docs/memory-tier.md, issue 37): a
spare of a job with the memory tier runs a store while it stands by and says where
(`record`); the VM it stands by for, told to save and stop once the spares are ready, is
told that store too (`for_instance`), and its notice save goes there beside the storage
write. The spare resumes from it, verified, faster than from storage and even when
storage's write missed the window.

The store's token is derived here, never stored: the spare reads it in its job spec, the
noticed VM in the heartbeat answer that stops it, each over its own agent's channel."""

from __future__ import annotations

from django.utils.crypto import salted_hmac

from respawn import protocol
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import Instance


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
