"""Notifications' tables (DESIGN §11): subscriptions, the happenings people may be
told of, and each delivery with its attempts."""

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from respawn_server.jobs.core.choices import Channel, DeliveryStatus, NotificationKind
from respawn_server.jobs.models.core import Job, Team


class Subscription(models.Model):
    """Who is told of what, and how (respawn_server.jobs.notify). A team's subscription (no user) is
    managed by the team's admins and covers every job of the team; a person's covers
    the jobs they own and their team's budget. The webhook secret is kept sealed
    (respawn_server.jobs.core.secret_env), opened only to sign with, and shown only when the
    subscription is created; a URL is kept in the clear."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="subscriptions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="subscriptions", help_text="Empty: the team's, managed by its admins.")
    name = models.CharField(max_length=100)
    events = models.JSONField(default=list, help_text="The NotificationKind values to be told of.")
    channel = models.CharField(max_length=10, choices=Channel.CHOICES)
    url = models.CharField(max_length=2000, blank=True, help_text="Webhook or Slack URL; checked at save and send.")
    email = models.EmailField(blank=True)
    secret = models.TextField(blank=True, help_text="HMAC-SHA256 key of the webhook signature, sealed "
                                                    "(respawn_server.jobs.core.secret_env): never plaintext.")
    preemption_burst = models.PositiveIntegerField(
        default=3, validators=[MinValueValidator(1)], help_text="Preemptions of one job within an hour that make a burst.")
    recovering_after_s = models.PositiveIntegerField(
        default=1800, validators=[MinValueValidator(1)], help_text="A job recovering this long is reported.")
    enabled = models.BooleanField(default=True)
    failing_reason = models.TextField(blank=True, help_text="Why the last delivery failed every retry; cleared by a "
                                                            "later success.")
    failing_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name", "id"]
        indexes = [models.Index(fields=["team", "enabled"], name="subscription_team_enabled_idx")]

    def __str__(self):
        return f"{self.name} ({self.channel})"


class Notification(models.Model):
    """One happening people may be told of. `key` names it (e.g. 'job.failed:12'), so
    the same happening reported twice (an agent's resend, two reconcilers) is one row."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notifications")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=30, choices=NotificationKind.CHOICES)
    key = models.CharField(max_length=200, unique=True)
    title = models.CharField(max_length=300)
    text = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return self.key


class Delivery(models.Model):
    """One notification to one subscription: at most one per pair (DESIGN §11)."""

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=DeliveryStatus.CHOICES, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["notification", "subscription"],
                                               name="delivery_once_per_subscription")]
        indexes = [models.Index(fields=["subscription", "-created_at"], name="delivery_subscription_time_idx")]


class DeliveryAttempt(models.Model):
    """One try at sending a delivery: what the endpoint answered, or why nothing did."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    started_at = models.DateTimeField()
    duration_s = models.FloatField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    ok = models.BooleanField()

    class Meta:
        ordering = ["started_at", "id"]
