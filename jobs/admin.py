from django.contrib import admin

from respawn_server.jobs import models


@admin.register(models.Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "team", "owner", "status", "preemptions", "last_step", "created_at"]
    list_filter = ["status", "team"]
    search_fields = ["name"]
    # Encrypted values only: a staff edit here would store one unencrypted (respawn_server.jobs.core.secret_env).
    exclude = ["secret_env"]


@admin.register(models.Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "rank", "provider", "zone", "instance_type", "market", "state", "end_reason"]
    list_filter = ["state", "provider", "market"]
    exclude = ["bootstrap_token_hash", "agent_token_hash"]


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    exclude = ["key_hash"]


for model in (
    models.Team,
    models.Membership,
    models.Invitation,
    models.JobEvent,
    models.InstanceEvent,
    models.InterruptionEvent,
    models.Checkpoint,
    models.MetricPoint,
    models.LogChunk,
    models.PriceQuote,
    models.ProcessedEvent,
    models.ServiceBeat,
):
    admin.site.register(model)
