"""The job's preemption counter (and so `max_preemptions`): which ends of its VMs it counts."""

from __future__ import annotations

from respawn_server.jobs.core.choices import EndReason
from respawn_server.jobs.core.drilled import caused_by_drill

# The ends the cloud causes: it took the VM back (preempted), or the VM went silent (lost).
CLOUD_ENDS = (EndReason.PREEMPTED, EndReason.LOST)


def counts_as_preemption(end_reason: str, instance_id: int | None) -> bool:
    """Whether an instance's end is an interruption the cloud caused: preempted or lost,
    and no drill sent it. The control plane's own ends never count: fenced (a planned
    move, a gang saving together), cancelled (the job cancelled, or the control plane
    stopping: `make demo` on Ctrl-C), nor a capacity refusal (nothing was running)."""
    return end_reason in CLOUD_ENDS and not caused_by_drill(instance_id)
