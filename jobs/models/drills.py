"""The drills' table: one row per drill asked for, and what happened to the request (sent
when, or refused why). Its phases and verdict are derived when read
(respawn_server.jobs.drills.report), so no figure here can go stale."""

from django.conf import settings
from django.db import models

from respawn_server.jobs.core.choices import DrillStatus


class Drill(models.Model):
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="drills")
    instance = models.ForeignKey("jobs.Instance", on_delete=models.PROTECT, related_name="drills",
                                 help_text="The VM interrupted: the job's live instance of `rank` when asked.")
    rank = models.PositiveIntegerField(default=0)
    with_notice = models.BooleanField(default=True, help_text="The cloud's own notice first; else a hard reclaim.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=12, choices=DrillStatus.CHOICES, default=DrillStatus.REQUESTED)

    requested_at = models.DateTimeField(auto_now_add=True)
    interrupted_at = models.DateTimeField(null=True, blank=True, help_text="The cloud accepted the interruption.")
    cause = models.TextField(blank=True, help_text="Why it was refused, in words (a sent drill's report names why "
                                                   "it failed).")
    missing_permission = models.CharField(max_length=200, blank=True,
                                          help_text="The cloud permission the drill lacked, when refused for it.")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="When it was refused.")

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["instance", "status"], name="drill_instance_status_idx")]

    def __str__(self):
        return f"drill {self.pk} of job {self.job_id} rank {self.rank}"
