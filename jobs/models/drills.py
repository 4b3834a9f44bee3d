"""The drills' table: one row per drill asked for, its phases as they happened and its
verdict (respawn_server.jobs.drills)."""

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

    # Phases, each when the control plane saw it (empty until then).
    requested_at = models.DateTimeField(auto_now_add=True)
    interrupted_at = models.DateTimeField(null=True, blank=True, help_text="The cloud accepted the interruption.")
    notice_seen_at = models.DateTimeField(null=True, blank=True, help_text="The agent's report of the notice.")
    save_committed_at = models.DateTimeField(null=True, blank=True, help_text="The notice checkpoint committed.")
    replacement_requested_at = models.DateTimeField(null=True, blank=True)
    replacement_booted_at = models.DateTimeField(null=True, blank=True, help_text="The replacement's agent registered.")
    validated_at = models.DateTimeField(null=True, blank=True, help_text="The checkpoint resumed from was validated.")
    training_again_at = models.DateTimeField(null=True, blank=True, help_text="First step past the resume point.")
    steps_lost = models.PositiveBigIntegerField(null=True, blank=True)
    window_s = models.FloatField(null=True, blank=True, help_text="The notice window the save had to meet.")

    cause = models.TextField(blank=True, help_text="Why it failed or was refused, in words; empty when it passed.")
    missing_permission = models.CharField(max_length=200, blank=True,
                                          help_text="The cloud permission the drill lacked, when refused for it.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["instance", "status"], name="drill_instance_status_idx")]

    def __str__(self):
        return f"drill {self.pk} of job {self.job_id} rank {self.rank}"
