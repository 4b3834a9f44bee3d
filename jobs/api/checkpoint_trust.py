"""What a checkpoint report from a VM must show before it is recorded: the next VM of
the job resumes from the newest one, so a report is a claim about where the job's
state lies and how far it got, and is judged as one.

- Its URI lies under the job's own storage prefix (the one register gave the agent,
  DESIGN §6), with the prefix's scheme and bucket, and no `.` or `..` segment, even
  percent-encoded: never another job's checkpoints, nor a path outside the store.
- Its step is at most the job's `total_steps`, and at most STEPS_AHEAD_FLOOR steps, or
  twice what the instance's own pace since it started would have made by now, ahead
  of the step its heartbeats last reported. Checkpoints are reported as they commit,
  between two heartbeats, and late after an outage of the control plane (the pace
  term grows with the time since the last heartbeat); a step beyond that is no
  checkpoint its trainer can have made.

A metrics batch's steps are held to the first bound, `total_steps`, too (`beyond_total`).
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.utils import timezone

from respawn_server.jobs.models import Instance, Job

STEPS_AHEAD_FLOOR = 1000


def uri_problem(uri: str, job: Job) -> str | None:
    """Why `uri` cannot be a checkpoint of `job`, or None."""
    prefix = job.storage_uri
    outside = f"must lie under this job's storage prefix {prefix}/"
    got, want = urlsplit(uri), urlsplit(prefix)
    if (got.scheme, got.netloc) != (want.scheme, want.netloc) or got.query or got.fragment:
        return outside
    if any(ord(c) < 32 for c in uri):
        return "must not contain control characters"
    if any(segment in (".", "..") for segment in unquote(got.path).split("/")):
        return "must not contain '.' or '..' path segments"
    if not uri.startswith(prefix + "/") or not uri[len(prefix) + 1:].strip("/"):
        return outside
    return None


def most_steps_ahead(instance: Instance, now=None) -> int:
    """How far past its last heartbeat's step a checkpoint of `instance` may lie."""
    now = now or timezone.now()
    start = instance.resume_checkpoint.step if instance.resume_checkpoint_id else 0
    ahead = STEPS_AHEAD_FLOOR
    if instance.running_at and instance.last_heartbeat_at and instance.last_heartbeat_at > instance.running_at:
        pace = max(instance.last_step - start, 0) / (instance.last_heartbeat_at - instance.running_at).total_seconds()
        since = (now - instance.last_heartbeat_at).total_seconds() + settings.RESPAWN["HEARTBEAT_INTERVAL_S"]
        ahead = max(ahead, int(2 * pace * since))
    return ahead


def beyond_total(step: int, job: Job) -> str | None:
    """Why `step` is no step of `job`'s (a checkpoint's, or a metrics point's), or None."""
    if job.total_steps is not None and step > job.total_steps:
        return f"{step} is beyond the job's total_steps ({job.total_steps})"
    return None


def step_problem(step: int, instance: Instance) -> str | None:
    """Why `step` cannot be a checkpoint of `instance`, or None."""
    if beyond := beyond_total(step, instance.job):
        return beyond
    ahead = most_steps_ahead(instance)
    if step > instance.last_step + ahead:
        return (f"{step} is more than {ahead} steps ahead of the step this instance last reported "
                f"({instance.last_step})")
    return None
