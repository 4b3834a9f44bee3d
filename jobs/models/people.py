"""People's tables: memberships and invitations of teams, API tokens, and the
rate limiter's buckets."""

from django.conf import settings
from django.db import models

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models.core import Team


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.CHOICES, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_user_team_unique")]

    def __str__(self):
        return f"{self.user} in {self.team} as {self.role}"


class ApiToken(models.Model):
    """A person's API token. Only its SHA-256 is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart in lists.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class RateLimitBucket(models.Model):
    """Recent attempts of one client at one rate-limited thing (respawn_server.jobs.people.ratelimit),
    in the database so that every worker process counts against the same limit."""

    scope = models.CharField(max_length=30)
    ident = models.CharField(max_length=200, help_text="Client address, or person, the limit counts for.")
    hits = models.JSONField(default=list, help_text="Unix times of the attempts within the rate's period.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "ident"], name="ratelimit_scope_ident_unique")]
        indexes = [models.Index(fields=["scope", "updated_at"], name="ratelimit_scope_time_idx")]


class Invitation(models.Model):
    """A team admin's offer of a place in the team. Nobody joins a team without
    saying yes: the membership exists only once the invited person accepts."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=10, choices=Role.CHOICES)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="invitation_user_team_unique")]

    def __str__(self):
        return f"{self.user} invited to {self.team} as {self.role}"
