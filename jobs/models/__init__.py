"""The domain's tables (DESIGN §3), one module per subsystem: `core` (teams, jobs,
instances, checkpoints, their events, the audit log), `reports` (what the agents' API
keeps: processed event ids, its own liveness, metric points, steps, log lines), `money`
(price quotes), `people` (memberships, invitations, tokens, rate-limit buckets), `notify`
(subscriptions, notifications, deliveries) and `drills`. All are tables of the one app
`jobs`: `from respawn_server.jobs.models import Job` names any of them, and the
migrations know them by that label, not by module.

They stay together here rather than in each subsystem's folder (as saleor and netbox
do) because the tables are the layer under every subsystem, not a part of one: their
foreign keys cross subsystems (a notification names a job, a membership a team, a drill
an instance), and each subsystem reads others' tables (placement prices with money's
quotes, money sums the core's instances, notify writes on the core's events). In the
subsystems' folders, the core's `from respawn_server.jobs.models import Job` would
import every subsystem, notify included, which the layers forbid. So these modules
import only Django and `respawn_server.jobs.core.choices` (and each other: `core`
first), and anything may import them (tests/test_layout.py).
"""

from respawn_server.jobs.models.core import (
    FAILURE_MESSAGE_CHARS,
    RESUME_STEP,
    RESUMED_FROM_WRITER,
    AuditEvent,
    Checkpoint,
    Instance,
    InstanceEvent,
    InterruptionEvent,
    Job,
    JobEvent,
    SourceArchive,
    Team,
    WorldSize,
    failure_headline,
    failure_message,
    resume_step_of,
)
from respawn_server.jobs.models.drills import Drill
from respawn_server.jobs.models.money import DiskPriceQuote, PriceQuote
from respawn_server.jobs.models.notify import Delivery, DeliveryAttempt, Notification, Subscription
from respawn_server.jobs.models.people import ApiToken, Invitation, Membership, RateLimitBucket
from respawn_server.jobs.models.reports import LogChunk, MetricPoint, ProcessedEvent, ServiceBeat, StepPoint

__all__ = [
    "FAILURE_MESSAGE_CHARS", "RESUME_STEP", "RESUMED_FROM_WRITER", "ApiToken", "AuditEvent", "Checkpoint", "Delivery",
    "DeliveryAttempt", "DiskPriceQuote", "Drill", "Instance", "InstanceEvent", "InterruptionEvent", "Invitation", "Job",
    "JobEvent", "LogChunk", "Membership", "MetricPoint", "Notification", "PriceQuote", "ProcessedEvent",
    "RateLimitBucket", "ServiceBeat", "SourceArchive", "StepPoint", "Subscription", "Team", "WorldSize",
    "failure_headline", "failure_message", "resume_step_of",
]
