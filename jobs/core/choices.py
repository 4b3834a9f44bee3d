"""Every state name and enum of the domain, one class each, with named groups.

The transition tables of DESIGN §4 live here too: one table per state machine,
consulted only by `respawn_server.jobs.core.transitions`.
"""

from respawn.protocol import CheckpointKind, CheckpointTier, NoticeSource, Purpose, ValidationResult  # noqa: F401  (re-exported)
from respawn.vocabulary.notify import Channel, DeliveryStatus, NotificationKind  # noqa: F401  (re-exported)


class JobStatus:
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RECOVERING = "recovering"
    FINISHING = "finishing"  # training succeeded, its artifact is recorded; the post step runs on on-demand
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    ALL = (QUEUED, PROVISIONING, RUNNING, RECOVERING, FINISHING, CANCELLING, SUCCEEDED, FAILED, CANCELLED)
    TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
    ACTIVE = frozenset({PROVISIONING, RUNNING, RECOVERING, FINISHING})  # holds or is getting VMs
    CANCELLABLE = frozenset({QUEUED, PROVISIONING, RUNNING, RECOVERING, FINISHING})
    CHOICES = [(s, s) for s in ALL]

    TRANSITIONS: dict[str, frozenset[str]] = {
        QUEUED: frozenset({PROVISIONING, CANCELLED}),
        PROVISIONING: frozenset({RUNNING, QUEUED, RECOVERING, FAILED, CANCELLING}),
        # running -> finishing only for a job with a post step (respawn_server.jobs.recovery.after_end._maybe_succeed).
        RUNNING: frozenset({SUCCEEDED, FINISHING, RECOVERING, FAILED, CANCELLING}),
        RECOVERING: frozenset({PROVISIONING, FAILED, CANCELLING}),
        # The post step's outcome is the job's: a failing post step fails the job (its
        # artifact stays recorded); a lost post VM is replaced without a status change.
        FINISHING: frozenset({SUCCEEDED, FAILED, CANCELLING}),
        CANCELLING: frozenset({CANCELLED}),
        SUCCEEDED: frozenset(),
        FAILED: frozenset(),
        CANCELLED: frozenset(),
    }


class FailureCause:
    USER_CODE = "user_code"
    SETUP = "setup"
    NO_CAPACITY = "no_capacity"
    PRECHECKS = "prechecks"
    DEADLINE = "deadline"
    CONTROLLER = "controller"
    ALL = (USER_CODE, SETUP, NO_CAPACITY, PRECHECKS, DEADLINE, CONTROLLER)
    CHOICES = [(c, c) for c in ALL]
    # What a person reads, so they see at once whether to fix code, quota or settings.
    LABELS = {
        USER_CODE: "The training code failed",
        SETUP: "Setup failed (prepare step, environment or rendezvous)",
        NO_CAPACITY: "No capacity",
        PRECHECKS: "Refused before it ran (credentials, quota or job spec)",
        DEADLINE: "The deadline passed",
        CONTROLLER: "The control plane failed",
    }


class InstanceState:
    REQUESTED = "requested"
    BOOTING = "booting"
    RUNNING = "running"
    PREEMPTING = "preempting"
    ENDED = "ended"

    ALL = (REQUESTED, BOOTING, RUNNING, PREEMPTING, ENDED)
    LIVE = frozenset({REQUESTED, BOOTING, RUNNING, PREEMPTING})  # holds its node slot
    CHOICES = [(s, s) for s in ALL]

    TRANSITIONS: dict[str, frozenset[str]] = {
        REQUESTED: frozenset({BOOTING, ENDED}),
        BOOTING: frozenset({RUNNING, ENDED}),
        RUNNING: frozenset({PREEMPTING, ENDED}),
        PREEMPTING: frozenset({ENDED}),
        ENDED: frozenset(),
    }


class EndReason:
    COMPLETED = "completed"
    PREEMPTED = "preempted"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"
    CAPACITY_ERROR = "capacity_error"
    FENCED = "fenced"
    ALL = (COMPLETED, PREEMPTED, FAILED, LOST, CANCELLED, CAPACITY_ERROR, FENCED)
    CHOICES = [(r, r) for r in ALL]


class InterruptionKind:
    NOTICE = "notice"
    PREEMPTED = "preempted"
    LOST = "lost"
    CAPACITY_ERROR = "capacity_error"
    # A member interrupted the instance on purpose (respawn_server.jobs.drills): the notice or reclaim that
    # follows is recorded under its own kind as well, and none of it counts as a preemption.
    DRILL = "drill"
    ALL = (NOTICE, PREEMPTED, LOST, CAPACITY_ERROR, DRILL)
    CHOICES = [(k, k) for k in ALL]


class Market:
    """How an instance is bought: spot (cheap, interruptible) or on-demand."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    ALL = (SPOT, ON_DEMAND)


class Role:
    VIEWER = "viewer"
    MEMBER = "member"
    ADMIN = "admin"
    ALL = (VIEWER, MEMBER, ADMIN)
    RANK = {VIEWER: 1, MEMBER: 2, ADMIN: 3}
    CHOICES = [(r, r) for r in ALL]


MARKET_CHOICES = [(m, m) for m in Market.ALL]
PURPOSE_CHOICES = [(p, p) for p in Purpose.ALL]
CHECKPOINT_KIND_CHOICES = [(k, k) for k in CheckpointKind.ALL]
VALIDATION_CHOICES = [(v, v) for v in ValidationResult.ALL]
NOTICE_SOURCE_CHOICES = [(s, s) for s in NoticeSource.ALL]


class AuditAction:
    """What the audit log records (who did it is on the row)."""

    JOB_SUBMITTED = "job.submitted"
    JOB_CANCELLED = "job.cancelled"
    LIMITS_CHANGED = "team.limits_changed"
    MEMBER_INVITED = "member.invited"
    INVITATION_DECLINED = "member.invitation_declined"
    MEMBER_ADDED = "member.added"
    MEMBER_ROLE_CHANGED = "member.role_changed"
    MEMBER_REMOVED = "member.removed"
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    JOB_DRILLED = "job.drilled"
    ALL = (JOB_SUBMITTED, JOB_CANCELLED, LIMITS_CHANGED, MEMBER_INVITED, INVITATION_DECLINED, MEMBER_ADDED,
           MEMBER_ROLE_CHANGED, MEMBER_REMOVED, TOKEN_CREATED, TOKEN_REVOKED, JOB_DRILLED)
    CHOICES = [(a, a) for a in ALL]


class DrillStatus:
    """A drill (respawn_server.jobs.drills): asked for, sent to the cloud, then judged from what
    followed. The row holds the first four; a sent drill's report derives PASSED or FAILED
    from the job's rows each time it is read (respawn_server.jobs.drills.report)."""

    REQUESTED = "requested"  # recorded by the web request; a worker calls the cloud
    SENDING = "sending"  # a worker claimed it and is calling the cloud
    SENT = "sent"  # the cloud accepted the interruption: the job recovers from it, the report judges
    REFUSED = "refused"  # never sent: a missing permission, no live VM, a cloud that cannot
    PASSED = "passed"  # a report's verdict, never stored
    FAILED = "failed"  # a report's verdict, never stored
    ALL = (REQUESTED, SENDING, SENT, REFUSED)
    # Sent (or being sent) to the cloud: the instance's interruption is the drill's, not a preemption.
    INTERRUPTING = frozenset({SENDING, SENT})
    OPEN = frozenset({REQUESTED, SENDING, SENT})  # SENT stays open until its report has a verdict
    CHOICES = [(s, s) for s in ALL]

    TRANSITIONS: dict[str, frozenset[str]] = {
        REQUESTED: frozenset({SENDING, REFUSED}),
        # Back to requested when the cloud call failed transiently and is retried.
        SENDING: frozenset({SENT, REFUSED, REQUESTED}),
        SENT: frozenset(),
        REFUSED: frozenset(),
    }
