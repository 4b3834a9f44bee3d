"""What the agents' API receives and keeps: each report's event id (a resend applied
once), the API's own liveness, the heartbeat metric points, the trainer's steps and
the output lines."""

from django.db import models

from respawn_server.jobs.models.core import Instance, Job


class MetricPoint(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="metrics")
    time = models.DateTimeField()
    step = models.PositiveBigIntegerField()
    loss = models.FloatField(null=True, blank=True)
    samples_per_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["time", "id"]
        indexes = [models.Index(fields=["job", "time"], name="metric_job_time_idx")]


class StepPoint(models.Model):
    """One training step as the trainer reported it (`POST metrics`, shipped by the
    agent in batches), for the loss curve. Apart from MetricPoint, whose one point per
    heartbeat at the server's clock is what the ledger measures speed and restore time
    from; `time` here is the VM's clock, for display only. One row per (instance, step):
    a batch sent again, or a restarted trainer's repeated steps, add nothing."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="step_points")
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="step_points")
    step = models.PositiveBigIntegerField()
    time = models.DateTimeField()
    loss = models.FloatField(null=True, blank=True)
    samples_per_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["instance", "step"]
        constraints = [models.UniqueConstraint(fields=["instance", "step"], name="steppoint_instance_step_unique")]
        indexes = [models.Index(fields=["job", "instance", "step"], name="steppoint_job_curve_idx")]


class LogChunk(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.PositiveBigIntegerField(help_text="Index of the first line in the instance's output.")
    lines = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["instance", "offset"]
        constraints = [models.UniqueConstraint(fields=["instance", "offset"], name="logchunk_instance_offset_unique")]


class ProcessedEvent(models.Model):
    """Every agent report's `event_id`, so a resend is applied at most once.

    The unique (instance, event_id) pair does the deduplication: of two concurrent
    resends one insert wins and the other gets an IntegrityError inside the same
    transaction that would have applied it. Per instance, so that no VM can spend
    another's event ids."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="+")
    event_id = models.UUIDField()
    kind = models.CharField(max_length=20)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "event_id"], name="processed_event_once")]


class ServiceBeat(models.Model):
    """When the agent API was last seen serving, and since when without a gap.

    The reconciler marks no instance lost until the API has served for one full
    heartbeat timeout: an outage of the control plane is not an outage of every VM."""

    name = models.CharField(max_length=30, primary_key=True)
    last_seen = models.DateTimeField()
    serving_since = models.DateTimeField()
