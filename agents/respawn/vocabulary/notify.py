"""What a person may be notified of, and how: the names the CLI and the control plane
share (respawn_server.jobs.core.choices re-exports them; standard library only, the CLI never
imports Django)."""


class NotificationKind:
    """What a subscription may ask to be told of (respawn_server.jobs.notify)."""

    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    PREEMPTION_BURST = "job.preemption_burst"
    RECOVERING_LONG = "job.recovering_long"
    BUDGET_WARNING = "team.budget_warning"
    LAUNCH_HELD = "job.launch_held"
    DEADLINE_AT_RISK = "job.deadline_at_risk"
    CHECKPOINT_INVALID = "checkpoint.invalid"
    TEST = "test"  # the dashboard's "send test message": always delivered to the one subscription
    SUBSCRIBABLE = (JOB_SUCCEEDED, JOB_FAILED, PREEMPTION_BURST, RECOVERING_LONG, BUDGET_WARNING, LAUNCH_HELD,
                    DEADLINE_AT_RISK, CHECKPOINT_INVALID)
    ALL = (*SUBSCRIBABLE, TEST)
    CHOICES = [(k, k) for k in ALL]
    LABELS = {
        JOB_SUCCEEDED: "Job succeeded",
        JOB_FAILED: "Job failed (cause and log tail)",
        PREEMPTION_BURST: "Preemption burst (N in an hour)",
        RECOVERING_LONG: "Job recovering longer than a threshold",
        BUDGET_WARNING: "Team budget warning",
        LAUNCH_HELD: "Launch held by the budget",
        DEADLINE_AT_RISK: "Deadline at risk (even on-demand would miss it)",
        CHECKPOINT_INVALID: "Checkpoint failed validation",
        TEST: "Test message",
    }

class Channel:
    WEBHOOK = "webhook"  # JSON body, signed (X-Respawn-Signature)
    SLACK = "slack"  # a Slack-compatible incoming webhook: {"text": ...}
    EMAIL = "email"  # Django's email backend
    ALL = (WEBHOOK, SLACK, EMAIL)
    CHOICES = [(c, c) for c in ALL]

class DeliveryStatus:
    PENDING = "pending"  # queued, or between retries
    SENT = "sent"
    FAILED = "failed"  # every retry failed; the subscription is marked failing
    ALL = (PENDING, SENT, FAILED)
    CHOICES = [(s, s) for s in ALL]
