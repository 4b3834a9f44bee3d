"""Serializers of the people's API (/api/v1/). Fields listed explicitly."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlparse

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers

from respawn.sourcetree import DIGEST_PREFIX, DIGEST_RE
from respawn_server.jobs.core.choices import FailureCause
from respawn_server.jobs.core.services import create_job
from respawn_server.jobs.fleet import catalog
from respawn_server.jobs.models import (Checkpoint, Instance, InterruptionEvent, Job, JobEvent, PriceQuote, SourceArchive, Team,
                         WorldSize)
from respawn_server.jobs.money import downtime
from respawn_server.jobs.people.permissions import may_read_env_values, roles_of, visible_team_ids
from respawn.vocabulary.names import closest_name
from respawn.vocabulary.spec_text import container_image_problem, env_problem, machine_image_problem, nul_problem

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
KNOWN_CLOUDS = ("aws", "gcp", "azure", "local")
STORAGE_SCHEMES = ("", "file", "s3", "gs", "az")
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")  # never ext:: (git runs its command)
GIT_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


@extend_schema_field({"type": "string", "nullable": True, "pattern": DIGEST_RE.pattern,
                      "description": "The job's code: \"sha256:<hex>\" of an archive uploaded to its team "
                                     "(PUT /api/v1/sources/{digest}/); its VMs unpack it into working_dir."})
class SourceArchiveField(serializers.Field):
    def to_representation(self, archive):
        return DIGEST_PREFIX + archive.sha256

    def to_internal_value(self, data):
        if not isinstance(data, str) or not DIGEST_RE.match(data):
            raise serializers.ValidationError('must be "sha256:" and 64 lowercase hex digits')
        return data[len(DIGEST_PREFIX):]


class TeamSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "name", "monthly_budget_usd", "max_concurrent_gpus", "budget_warning", "role", "created_at"]

    def get_role(self, team) -> str | None:
        return roles_of(self.context["request"].user).get(team.pk)


def _string_list(value, field, *, allow_empty=True):
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise serializers.ValidationError(f"{field} must be a list of non-empty strings")
    if not allow_empty and not value:
        raise serializers.ValidationError(f"{field} must not be empty")
    problem = nul_problem(value)
    if problem:
        raise serializers.ValidationError(f"{field}: {problem}")
    return value


class RefusesUnknownFields:
    """A body key that is no writable field is refused (400 naming it), not dropped:
    dropped, a misspelt `totl_steps` made a job with no total. The suggestion is the
    one the CLI's job-file check makes (respawn.vocabulary.names)."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            writable = [name for name, field in self.fields.items() if not field.read_only]
            errors = {key: [self._why_refused(key, writable)] for key in data if key not in writable}
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def _why_refused(self, key: str, writable: list[str]) -> str:
        if key in self.fields:
            return f"'{key}' is set by the server; it cannot be submitted"
        close = closest_name(key, writable)
        return f"unknown field '{key}'" + (f"; did you mean '{close}'?" if close else f"; known fields: {', '.join(writable)}")


class TeamField(serializers.PrimaryKeyRelatedField):
    """A team by name or by id, as the CLI takes it. Both are looked up among the
    requester's own teams only, so another team's name or id answers as an unknown one."""

    default_error_messages = {"no_team_named": "you are in no team '{name}'; your teams: {names}"}

    def __init__(self, **kwargs):
        super().__init__(queryset=Team.objects.all(), **kwargs)

    def get_queryset(self):
        return Team.objects.filter(pk__in=visible_team_ids(self.context["request"].user))

    def to_internal_value(self, data):
        if not isinstance(data, str):
            return super().to_internal_value(data)
        yours = self.get_queryset().order_by("name")
        named = next((team for team in yours if team.name == data), None)
        if named is not None:
            return named
        if data.isdigit():
            return super().to_internal_value(data)
        self.fail("no_team_named", name=data, names=", ".join(team.name for team in yours) or "none")


class JobSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    team = TeamField()
    command = serializers.JSONField(help_text="argv list, e.g. [\"python\", \"train.py\"]")
    newest_checkpoint_step = serializers.IntegerField(source="newest_checkpoint.step", read_only=True,
                                                      default=None, allow_null=True)
    newest_valid_checkpoint_step = serializers.IntegerField(
        source="newest_valid_checkpoint.step", read_only=True, default=None, allow_null=True
    )
    # Declared so the schema lists "" (not failed); a read-only model field loses allow_blank.
    failure_cause = serializers.ChoiceField(choices=FailureCause.CHOICES, allow_blank=True, read_only=True)
    source_archive = SourceArchiveField(required=False, allow_null=True)
    failure_headline = serializers.CharField(
        read_only=True, help_text="The failure in one line, never cut: for the user's code its exit code and last "
                                  "exception line; the rest of failure_message is the end of the output.")

    class Meta:
        model = Job
        fields = [
            "id", "team", "owner", "name", "command", "working_dir", "machine_image", "container_image", "env",
            "secret_env",
            "prepare_command", "prepare_inputs", "post_command", "nodes", "nodes_min", "accelerator",
            "accelerator_count", "instance_types", "allowed_clouds", "allowed_regions", "max_price_per_hour", "on_demand_after_preemptions",
            "deadline", "priority", "total_steps", "checkpoint_uri", "checkpoint_interval_s", "checkpoint_every_steps",
            "validation_enabled", "validation_model_factory", "validation_batch_factory", "validation_eval_fn",
            "validation_tolerance",
            "max_preemptions", "max_restarts", "spare_on_rebalance",
            "source_archive", "source_git_url", "source_git_commit",
            "status", "status_reason", "failure_cause", "failure_headline", "failure_message", "preemptions",
            "failure_restarts", "last_step", "newest_checkpoint_step", "newest_valid_checkpoint_step", "artifact_uri",
            "artifact_digest", "created_at", "updated_at", "finished_at",
        ]
        read_only_fields = [
            "status", "status_reason", "failure_cause", "failure_message", "preemptions", "failure_restarts",
            "last_step", "artifact_uri", "artifact_digest", "created_at", "updated_at", "finished_at",
        ]
        extra_kwargs = {
            "nodes": {"min_value": 1, "max_value": 64},
            "nodes_min": {"min_value": 1, "max_value": 64},
            "priority": {"min_value": -100, "max_value": 100},
            "total_steps": {"min_value": 1},
            "checkpoint_interval_s": {"min_value": 1},
            "checkpoint_every_steps": {"min_value": 1},  # 0 means nothing: the interval policy refuses it at register
            "max_price_per_hour": {"min_value": 0},
            "validation_tolerance": {"min_value": 0},
            "env": {"help_text": "Environment of the job's process, names to values. To a viewer of the team who "
                                 "is not the job's owner, every value reads null."},
            "secret_env": {"help_text": "Secret environment of the job's process, names to values: stored encrypted "
                                        "and given only to the job's live VMs. Read back, every value is null, for "
                                        "everyone."},
        }

    def to_representation(self, job):
        data = super().to_representation(job)
        if not may_read_env_values(self.context["request"].user, job):
            data["env"] = dict.fromkeys(data["env"])
        data["secret_env"] = dict.fromkeys(job.secret_env)  # stored encrypted; never given back to anyone
        return data

    def validate_command(self, value):
        return _string_list(value, "command", allow_empty=False)

    def validate_prepare_command(self, value):
        return _string_list(value, "prepare_command")

    def validate_prepare_inputs(self, value):
        return _string_list(value, "prepare_inputs")

    def validate_post_command(self, value):
        return _string_list(value, "post_command")

    def validate(self, attrs):
        self._refuse_unplaceable(attrs)
        attrs["source_archive"] = self._source_archive(attrs)
        both = sorted(set(attrs.get("env") or {}) & set(attrs.get("secret_env") or {}))
        if both:
            raise serializers.ValidationError({"secret_env": [f"{', '.join(both)} also in env: name each once"]})
        if attrs.get("prepare_inputs") and not attrs.get("prepare_command"):
            raise serializers.ValidationError({"prepare_inputs": ["prepare_inputs needs a prepare_command"]})
        if attrs.get("nodes_min") is not None and attrs["nodes_min"] > attrs.get("nodes", 1):
            raise serializers.ValidationError({"nodes_min": [
                f"nodes_min {attrs['nodes_min']} is above nodes {attrs.get('nodes', 1)}: an elastic gang trains on "
                "nodes_min..nodes nodes"]})
        if attrs.get("spare_on_rebalance") and attrs.get("nodes", 1) > 1:
            raise serializers.ValidationError({"spare_on_rebalance": [
                "spares are launched for one-node jobs only: a gang keeps saving together on a notice"]})
        if not (attrs.get("validation_model_factory") and attrs.get("validation_batch_factory")):
            # Nothing to validate with: `show` would say "validation_enabled yes" of checkpoints
            # that are all recorded `skipped`.
            attrs["validation_enabled"] = False
        return attrs

    def _source_archive(self, attrs) -> SourceArchive | None:
        """The job's code: one of its team's uploaded archives, or a git URL and commit, or neither."""
        sha256, url, commit = (attrs.get(f) for f in ("source_archive", "source_git_url", "source_git_commit"))
        if sha256 and (url or commit):
            raise serializers.ValidationError({"source_archive": [
                "a job's code is an archive or a git commit, not both: leave source_git_url and source_git_commit "
                "empty"]})
        if bool(url) != bool(commit):
            missing = "source_git_commit" if url else "source_git_url"
            raise serializers.ValidationError({missing: [f"{missing} is needed too: a git source is a URL and a "
                                                         "commit"]})
        if not sha256:
            return None
        archive = SourceArchive.objects.filter(team=attrs["team"], sha256=sha256).first()
        if archive is None:
            raise serializers.ValidationError({"source_archive": [
                f"team {attrs['team'].name} has no archive sha256:{sha256}: upload it first (PUT "
                f"/api/v1/sources/sha256:{sha256}/?team={attrs['team'].pk}, or `respawn submit --workdir DIR`)"]})
        return archive

    def validate_source_git_url(self, value):
        parsed = urlparse(value)
        if value and (parsed.scheme not in GIT_SCHEMES or not (parsed.netloc or parsed.scheme == "file")
                      or not parsed.path or any(c.isspace() or ord(c) < 32 for c in value)):
            raise serializers.ValidationError(f"source_git_url must be a {', '.join(GIT_SCHEMES)} URL of a "
                                              "repository, e.g. https://github.com/org/repo.git")
        if parsed.password:
            raise serializers.ValidationError("source_git_url must hold no password: every viewer of the team reads "
                                              "it, and so does the job's log. Give the VM its own access (a deploy "
                                              "key or credential helper in the machine image)")
        return value

    def validate_source_git_commit(self, value):
        if value and not GIT_COMMIT_RE.match(value):
            raise serializers.ValidationError("source_git_commit must be a full commit id (40 or 64 lowercase hex "
                                              "digits): a branch or tag could move between the job's VMs")
        return value

    def validate_instance_types(self, value):
        return _string_list(value, "instance_types")

    def validate_allowed_regions(self, value):
        return _string_list(value, "allowed_regions")

    def validate_allowed_clouds(self, value):
        _string_list(value, "allowed_clouds")
        unknown = sorted(set(value) - set(KNOWN_CLOUDS))
        if unknown:
            raise serializers.ValidationError(f"unknown clouds {unknown}; known: {list(KNOWN_CLOUDS)}")
        enabled = settings.RESPAWN["PROVIDERS"]
        disabled = sorted(set(value) - set(enabled))
        if disabled:
            raise serializers.ValidationError(f"clouds {disabled} are not enabled in this deployment; "
                                              f"enabled: {list(enabled)}")
        return value

    def validate_accelerator_count(self, value):
        most = catalog.max_accelerators_per_node()
        if value > most:
            raise serializers.ValidationError(f"at most {most} per node: no instance type in the price book has more")
        return value

    def _refuse_unplaceable(self, attrs):
        """Regions and instance types no enabled cloud prices, and more accelerators than a
        GPU allowance holds, would keep the job queued for ever (respawn_server.jobs.fleet.catalog)."""
        clouds = catalog.usable_clouds(attrs.get("allowed_clouds") or [])
        offer = catalog.Offer.of(clouds)
        errors = {}
        for field, known in (("allowed_regions", offer.regions), ("instance_types", offer.instance_types)):
            unknown = [value for value in attrs.get(field) or [] if value not in known]
            if unknown:
                close = closest_name(unknown[0], sorted(known))
                errors[field] = [f"{', '.join(unknown)}: not in the price book of {', '.join(clouds)}"
                                 + (f"; did you mean '{close}'?" if close else "")]
        regions, instance_types = attrs.get("allowed_regions") or [], attrs.get("instance_types") or []
        if not errors and (regions or instance_types) and not offer.allows(regions, instance_types):
            errors["instance_types"] = [f"none of {', '.join(instance_types)} is priced in {', '.join(regions)}"]
        gpus = attrs.get("nodes", 1) * attrs.get("accelerator_count", 1)
        problem = catalog.gpu_allowance_problem(attrs["team"], gpus)
        if problem:
            errors["accelerator_count"] = [problem]
        if errors:
            raise serializers.ValidationError(errors)

    def validate_env(self, value, field="env"):
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise serializers.ValidationError(f"{field} must be an object of string to string")
        problem = env_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_secret_env(self, value):
        return self.validate_env(value, "secret_env")

    def validate_machine_image(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("machine_image must be an object of cloud to image")
        problem = machine_image_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_container_image(self, value):
        problem = container_image_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_deadline(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("deadline is in the past")
        return value

    def validate_checkpoint_uri(self, value):
        if urlparse(value).scheme not in STORAGE_SCHEMES:
            raise serializers.ValidationError("checkpoint_uri must be a path or an s3://, gs://, az:// or file:// URI")
        return value

    def _validate_factory(self, value, field):
        if value and not FACTORY_RE.match(value):
            raise serializers.ValidationError(f"{field} must look like 'package.module:function'")
        return value

    def validate_validation_model_factory(self, value):
        return self._validate_factory(value, "validation_model_factory")

    def validate_validation_batch_factory(self, value):
        return self._validate_factory(value, "validation_batch_factory")

    def validate_validation_eval_fn(self, value):
        return self._validate_factory(value, "validation_eval_fn")

    def create(self, validated_data):
        if not validated_data.get("checkpoint_uri"):
            validated_data["checkpoint_uri"] = settings.RESPAWN["DEFAULT_CHECKPOINT_URI"]
        return create_job(**validated_data)


class DowntimePartsSerializer(serializers.Serializer):
    save = serializers.FloatField(help_text="Until the notice checkpoint was committed.")
    capacity = serializers.FloatField(help_text="Until a replacement VM was requested (the old VM's end, placement).")
    boot = serializers.FloatField(help_text="Until the replacement's agent registered.")
    validation = serializers.FloatField(help_text="Until the verdict on the resume checkpoint, when it came later.")
    restore = serializers.FloatField(help_text="Until the replacement reported a step past its resume step.")


class DowntimeSerializer(serializers.Serializer):
    instance = serializers.IntegerField(source="instance_id", help_text="The interrupted VM.")
    replacement = serializers.IntegerField(source="replacement_id", allow_null=True,
                                           help_text="The VM that resumed its node slot; null until one registered.")
    kind = serializers.ChoiceField(choices=["notice", "preempted", "lost"])
    interrupted = serializers.DateTimeField(help_text="The notice, or the last heartbeat of a VM gone without one.")
    resumed = serializers.DateTimeField(allow_null=True, help_text="null while the interruption is still open.")
    resume_step = serializers.IntegerField(allow_null=True, help_text=(
        "The step the node's work went on from (null until something resumed it): the interrupted VM's work past it "
        "was lost."))
    resume_tier = serializers.ChoiceField(choices=["storage", "memory", ""], help_text=(
        "Where that step was held: a checkpoint in storage, or the gang's memory tier (docs/memory-tier.md); \"\": "
        "from the start (resume_step 0), or nothing resumed yet (resume_step null)."))
    ongoing = serializers.BooleanField()
    downtime_s = serializers.FloatField(source="total_s", help_text="The sum of the parts; an open one up to now.")
    parts = DowntimePartsSerializer(help_text="Seconds on the path to the resumed training (docs/downtime.md).")


class WorldSizeSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorldSize
        fields = ["at", "world_size", "reason", "resume_step", "resume_tier"]

    resume_step = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "The step the gang went on from; null: from the start."))
    resume_tier = serializers.ChoiceField(choices=["storage", "memory", ""], read_only=True, help_text=(
        "Where that step was held: a checkpoint in storage, or the gang's memory tier (docs/memory-tier.md)."))


class JobDetailSerializer(JobSerializer):
    """A job as its detail answers it: with its downtime (one read per interruption, so not in the list)."""

    downtime_s = serializers.SerializerMethodField(help_text="Seconds the job was down across its interruptions "
                                                             "(overlaps counted once); open ones up to now.")
    interruptions = serializers.SerializerMethodField()
    world_sizes = WorldSizeSerializer(many=True, read_only=True, help_text=(
        "The job's world size over time: each gang placed, each regroup of an elastic gang (docs/elastic.md)."))

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "downtime_s", "interruptions", "world_sizes"]

    def to_representation(self, job):
        self._measured = downtime.job_downtime(job.pk, timezone.now())  # read once for both fields
        return super().to_representation(job)

    def get_downtime_s(self, job) -> float:
        return self._measured[0]

    @extend_schema_field(DowntimeSerializer(many=True))
    def get_interruptions(self, job):
        return DowntimeSerializer(self._measured[1], many=True).data


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["id", "created_at", "from_status", "to_status", "message"]


class InstanceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Instance
        fields = [
            "id", "job", "rank", "world_size", "purpose", "provider", "region", "zone", "instance_type", "market",
            "provider_instance_id", "price_per_hour_at_launch", "state", "end_reason", "requested_at",
            "running_at", "ended_at", "last_heartbeat_at", "last_step", "hostname", "agent_version",
            "checkpoint_interval",
        ]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = [
            "id", "checkpoint_id", "job", "instance", "step", "uri", "bytes", "manifest_digest", "kind",
            "committed_at", "tiers", "save_s", "stall_s", "reference_loss", "validation", "validation_loss",
            "validation_message", "validated_at",
        ]


class InterruptionSerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="instance.job_id", read_only=True)

    class Meta:
        model = InterruptionEvent
        fields = [
            "id", "job", "instance", "kind", "source", "notice_time", "deadline", "received_at",
            "checkpoint_saved", "steps_lost", "raw",
        ]


class PriceQuoteSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriceQuote
        fields = ["id", "provider", "region", "zone", "instance_type", "market", "usd_per_hour", "observed_at", "source"]


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})
    token_name = serializers.CharField(default="cli", max_length=100)


class TokenAnswerSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once; only its digest is stored.")
    name = serializers.CharField()


LOGS_AFTER_PARAMETER = OpenApiParameter(
    "after", str, description="The `next` of the previous answer; empty or absent: from the first line."
)


class LogLineSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    rank = serializers.IntegerField()
    offset = serializers.IntegerField(help_text="Line number in that instance's output.")
    line = serializers.CharField()
    agent = serializers.BooleanField(help_text="The agent's own line (what it did and why), not the trainer's output.")


class JobLogsSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True)
    next = serializers.CharField(help_text="Pass as `after` to read on from here.")
    more = serializers.BooleanField(help_text="More lines are ready now: read again at once.")
    job_status = serializers.CharField()
    finished = serializers.BooleanField(help_text="The job has ended and every line has been returned.")


class InterruptionRateSerializer(serializers.Serializer):
    provider = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()
    instance_type = serializers.CharField()
    market = serializers.CharField()
    per_hour = serializers.FloatField(help_text="Posterior median interruptions per hour: the point estimate, inside "
                                                "its 90 % credible interval.")
    mean_per_hour = serializers.FloatField(help_text="Posterior mean, what placement's expected cost uses; on thin "
                                                     "evidence it may lie outside the interval.")
    per_hour_low = serializers.FloatField(help_text="Lower end of the rate's 90 % credible interval, per hour.")
    per_hour_high = serializers.FloatField(help_text="Upper end of the rate's 90 % credible interval, per hour.")
    mtbi_hours = serializers.FloatField(allow_null=True, help_text="Hours between interruptions at per_hour.")
    usable_notice_fraction = serializers.FloatField()
    events = serializers.IntegerField(help_text="Interruptions of your teams' instances counted in the window "
                                                "(the estimate pools every team's).")
    exposure_hours = serializers.FloatField(help_text="Your teams' instance-hours in the window.")
    prior_per_hour = serializers.FloatField()
