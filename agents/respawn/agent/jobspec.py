"""Whether the job spec the control plane sent is one the agent can use."""

from __future__ import annotations

from respawn import protocol
from respawn.agent.channel import finite_or_none


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite_or_none(value) is not None


def check_job_spec(job: protocol.JobSpec) -> None:
    """ValueError naming the first field of the job spec the agent cannot use."""
    if not isinstance(job.command, list) or not job.command or not all(isinstance(a, str) for a in job.command):
        raise ValueError(f"job.command must be a non-empty list of strings, got {job.command!r}")
    for name in ("prepare_command", "prepare_inputs"):
        value = getattr(job, name)
        if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
            raise ValueError(f"job.{name} must be a list of non-empty strings, got {value!r}")
    if job.purpose not in protocol.Purpose.ALL:
        raise ValueError(f"job.purpose must be one of {protocol.Purpose.ALL}, got {job.purpose!r}")
    for name in ("env", "secret_env"):
        value = getattr(job, name)
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            # Never the value itself: a secret's would reach the agent's log.
            raise ValueError(f"job.{name} must map strings to strings, got names {sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__}")
    for name in ("heartbeat_interval_s", "notice_budget_s"):
        if not _is_number(getattr(job, name)) or getattr(job, name) <= 0:
            raise ValueError(f"job.{name} must be a number > 0, got {getattr(job, name)!r}")
    if job.checkpoint_interval_s is not None and (not _is_number(job.checkpoint_interval_s) or job.checkpoint_interval_s <= 0):
        raise ValueError(f"job.checkpoint_interval_s must be a number > 0 or null, got {job.checkpoint_interval_s!r}")
    for name in ("rank", "world_size"):
        if not isinstance(getattr(job, name), int) or isinstance(getattr(job, name), bool) or getattr(job, name) < 0:
            raise ValueError(f"job.{name} must be an integer >= 0, got {getattr(job, name)!r}")
    for name in ("checkpoint_uri", "working_dir", "rendezvous_addr", "artifact_uri", "artifact_digest"):
        if not isinstance(getattr(job, name), str):
            raise ValueError(f"job.{name} must be a string, got {getattr(job, name)!r}")
    if not isinstance(job.validation, protocol.ValidationSpec):
        raise ValueError(f"job.validation must be an object, got {job.validation!r}")
