"""Telling a drill's interruption from a preemption, for the counters, the learned
interruption rates and the back-off. The core and the fleet ask it (the drill table is one of respawn_server.jobs.models)."""

from __future__ import annotations

from django.db.models import Q

from respawn_server.jobs.core.choices import DrillStatus
from respawn_server.jobs.models import Drill


def caused_by_drill(instance_id: int | None) -> bool:
    """Whether `instance_id` was interrupted by a drill (sent, or being sent, to its cloud):
    its end is the drill's, no preemption. Another VM of the job reclaimed meanwhile is one."""
    return instance_id is not None and Drill.objects.filter(
        instance_id=instance_id, status__in=DrillStatus.INTERRUPTING).exists()


def not_drilled() -> Q:
    """Instances whose end no drill caused: what interruption rates and back-off learn from."""
    return ~Q(pk__in=Drill.objects.filter(status__in=DrillStatus.INTERRUPTING).values("instance_id"))
