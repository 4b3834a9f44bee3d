"""The agent API (/api/agent/v1/, DESIGN §5).

Every report carries an `event_id`; `apply_once` records it in the same
transaction that applies the report, so a resend after a network fault is a
no-op answered like the original. Heartbeat is the hot path: token lookup by
indexed digest, one short transaction, a fixed number of queries."""

from __future__ import annotations

import functools
import logging
import math

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import FileResponse, HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, fields, negotiation, permissions, renderers, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn import protocol
from respawn.sourcetree import MEDIA_TYPE
from respawn_server.jobs.api import checkpoint_trust, parsing
from respawn_server.jobs.api.errors import PayloadTooLarge, Unauthorized
from respawn_server.jobs.core import secret_env, services, sources, trackers
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.fleet import heartbeats
from respawn_server.jobs.fleet.placement import refresh_interval
from respawn_server.jobs.models import Checkpoint, Instance, LogChunk, ProcessedEvent, StepPoint
from respawn_server.jobs.people.auth import AgentTokenAuthentication, HeartbeatTokenAuthentication, agent_token_digest
from respawn_server.jobs.people.tokens import AGENT_PREFIX, hash_token, new_token
from respawn_server.jobs.recovery import handover
from respawn_server.jobs.recovery.elastic import resumed_from_memory, trainer_exited
from respawn_server.jobs.recovery.joiners import joiner_ready
from respawn_server.jobs.recovery.spares import spare_ready
from respawn_server.jobs.reports.checkpoints import record_checkpoint, record_validation
from respawn_server.jobs.reports.exits import record_exit
from respawn_server.jobs.reports.notices import record_notice, record_rebalance
from respawn_server.jobs.reports.registration import (REGISTER_MAX_FAILURES, record_prepare, register_failed,
                                                        register_instance)

log = logging.getLogger(__name__)

AGENT_MAX_BODY_BYTES = 256 * 1024
# No checkpoint save or stall takes a day; a bigger figure is garbage, and as a
# measured cost it would overflow the interval policy's arithmetic.
MAX_DURATION_S = 24 * 3600.0


class CappedJSONParser(parsing.JSONParser):
    max_body_bytes = AGENT_MAX_BODY_BYTES

    def parse(self, stream, media_type=None, parser_context=None):
        request = parser_context["request"]
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise exceptions.ParseError("Bad Content-Length.")
        if length > self.max_body_bytes:
            raise PayloadTooLarge(f"Body larger than {AGENT_MAX_BODY_BYTES} bytes.")
        data = super().parse(stream, media_type, parser_context)
        if not isinstance(data, dict):
            raise exceptions.ParseError("Body must be a JSON object.")
        return data


class FiniteFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return value


class CountField(serializers.IntegerField):
    """A step, byte count or offset: never negative, and it must fit the 64-bit column it is stored in."""

    def __init__(self, **kwargs):
        super().__init__(min_value=0, max_value=2**63 - 1, **kwargs)


class ReportSerializer(serializers.Serializer):
    event_id = serializers.UUIDField()
    sent_at = serializers.DateTimeField(required=False)


class RegisterSerializer(ReportSerializer):
    bootstrap_token = serializers.CharField(max_length=200)
    provider_instance_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    hostname = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    agent_version = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")


class HeartbeatSerializer(ReportSerializer):
    step = CountField()
    loss = FiniteFloatField(required=False, allow_null=True, default=None)
    samples_per_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0)
    last_checkpoint_step = CountField(required=False, allow_null=True)
    checkpoint_save_s = FiniteFloatField(required=False, allow_null=True, min_value=0, max_value=MAX_DURATION_S)
    checkpoint_stall_s = FiniteFloatField(required=False, allow_null=True, min_value=0, max_value=MAX_DURATION_S)
    trainer_exit_code = serializers.IntegerField(required=False, allow_null=True, default=None,
                                                 min_value=-255, max_value=255)
    gang_generation = CountField(required=False, default=0)
    memory_resume_step = CountField(required=False, allow_null=True, default=None)


class NoticeSerializer(ReportSerializer):
    source = serializers.ChoiceField(choices=protocol.NoticeSource.FROM_AGENT)
    notice_time = serializers.DateTimeField()
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    raw = serializers.CharField(required=False, allow_blank=True, default="", max_length=protocol.MAX_RAW_PAYLOAD_CHARS)
    kind = serializers.ChoiceField(choices=protocol.NoticeKind.ALL, default=protocol.NoticeKind.PREEMPT)


class CheckpointReportSerializer(ReportSerializer):
    checkpoint_id = serializers.UUIDField()
    step = CountField()
    uri = serializers.CharField(max_length=500)
    bytes = CountField()
    manifest_digest = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=protocol.CheckpointKind.ALL, default=protocol.CheckpointKind.PERIODIC)
    committed_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    save_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_S)
    stall_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_S)
    reference_loss = FiniteFloatField(required=False, allow_null=True, default=None)
    persist_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_S)
    notice_window_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_S)
    tiers = serializers.ListField(child=serializers.ChoiceField(choices=protocol.CheckpointTier.ALL), required=False,
                                  default=[protocol.CheckpointTier.STORAGE], max_length=len(protocol.CheckpointTier.ALL),
                                  help_text="Where the step was held as it committed, as its manifest records.")

    def validate_tiers(self, tiers: list[str]) -> list[str]:
        if protocol.CheckpointTier.STORAGE not in tiers:
            raise serializers.ValidationError("a committed checkpoint is in storage: tiers must name 'storage'")
        return [tier for tier in protocol.CheckpointTier.ALL if tier in tiers]


class ValidationReportSerializer(ReportSerializer):
    result = serializers.ChoiceField(choices=protocol.ValidationResult.FROM_AGENT)
    loss = FiniteFloatField(required=False, allow_null=True, default=None)
    reference_loss = FiniteFloatField(required=False, allow_null=True, default=None)
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class LogBatchSerializer(ReportSerializer):
    offset = CountField()
    lines = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=protocol.MAX_LOG_LINE_CHARS),
        max_length=protocol.MAX_LOG_LINES_PER_BATCH,
    )


class StepMetricSerializer(serializers.Serializer):
    step = CountField()
    time = serializers.DateTimeField()
    loss = FiniteFloatField(required=False, allow_null=True, default=None)
    samples_per_s = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0)


class MetricsBatchSerializer(ReportSerializer):
    points = serializers.ListField(child=StepMetricSerializer(), allow_empty=False,
                                   max_length=protocol.MAX_METRIC_POINTS_PER_BATCH)


class ExitSerializer(ReportSerializer):
    reason = serializers.ChoiceField(choices=protocol.ExitReason.ALL)
    exit_code = serializers.IntegerField(required=False, allow_null=True, default=None)
    final_step = CountField(required=False, allow_null=True, default=None)
    output_tail = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False,
                                        max_length=protocol.MAX_OUTPUT_TAIL_CHARS)
    last_exception = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    artifact_uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    artifact_digest = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)


AckSerializer = inline_serializer("Ack", {"ok": serializers.BooleanField(), "duplicate": serializers.BooleanField()})


def ack(duplicate: bool = False) -> Response:
    return Response(protocol.to_dict(protocol.Ack(duplicate=duplicate)))


def apply_once(instance: Instance, event_id, kind: str, apply) -> bool:
    """Run `apply()` unless `event_id` was already applied. Returns True if applied."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                ProcessedEvent.objects.create(event_id=event_id, instance_id=instance.pk, kind=kind)
        except IntegrityError:
            return False
        apply()
        return True


class AgentView(APIView):
    """An agent call. An ended instance's token, within its grace window, opens only the
    calls that deliver what the VM did (`open_after_end`: checkpoints, validation, logs,
    exit, DESIGN §4, §5; and its last steps' metrics unless it was lost or fenced); any
    other call from it is refused, so nothing a fenced VM says can steer its job's live
    instances."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [permissions.IsAuthenticated]
    parser_classes = [CappedJSONParser]
    body_serializer: type[serializers.Serializer]
    open_after_end = False

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if not self.open_after_end and self.instance.state == InstanceState.ENDED:
            raise exceptions.AuthenticationFailed(
                "Agent token revoked for this call: the instance ended. Until its grace window closes it may "
                "report only checkpoints, validation, logs, its last steps and its exit.")

    def validated(self, request) -> dict:
        body = self.body_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        return body.validated_data

    @property
    def instance(self) -> Instance:
        return self.request.auth


class FirstRendererNegotiation(negotiation.BaseContentNegotiation):
    """JSON whatever the Accept header says (the agent API has one renderer)."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class HeartbeatView(AgentView):
    """The hot path (respawn_server.jobs.fleet.heartbeats): one statement finds the token's instance and
    applies the heartbeat, so the token is judged after it and not by DRF beforehand.
    The schema and error messages are HeartbeatSerializer's, but its fields are built
    once: a serializer deep-copies its fields for every request.

    A well-formed heartbeat from a token that opens its instance is answered without
    DRF's request and response objects (`answer_plainly`; they were ~0.2 ms of CPU, a
    tenth of a heartbeat). Anything else goes through DRF and post(), so every refusal
    is DRF's, as on the other endpoints."""

    authentication_classes = [HeartbeatTokenAuthentication]  # its 401s, and the schema's scheme
    permission_classes = []  # post() admits the token
    open_after_end = True  # answered `stop`, with no writes (respawn_server.jobs.fleet.heartbeats)
    renderer_classes = [renderers.JSONRenderer]
    content_negotiation_class = FirstRendererNegotiation
    body_serializer = HeartbeatSerializer
    body_fields = HeartbeatSerializer().fields

    def dispatch(self, request, *args, **kwargs):
        answer = self.answer_plainly(request) if request.method == "POST" else None
        return answer if answer is not None else super().dispatch(request, *args, **kwargs)

    def answer_plainly(self, request) -> HttpResponse | None:
        """The answer to a heartbeat that needs no refusal, or None to leave it to DRF.
        When the token turns out not to open its instance, the statement has written
        nothing (it writes only for a live instance, which every token opens), so DRF
        may run it again to refuse."""
        length = request.META.get("CONTENT_LENGTH")
        if (request.content_type != "application/json" or (request.encoding or "utf-8").lower() != "utf-8"
                or not length or not length.isdigit() or int(length) > AGENT_MAX_BODY_BYTES):
            return None
        try:
            digest = agent_token_digest(request)
            body = parsing.loads(request.body)  # as CappedJSONParser reads it
            if not isinstance(body, dict):
                return None
            instance = self.apply(digest, self.checked(body))
        except (exceptions.APIException, ValueError):
            return None
        return HttpResponse(renderers.JSONRenderer().render(self.answer(instance)), content_type="application/json",
                            headers=self.default_response_headers)

    def perform_authentication(self, request):
        """Deferred to post() (DRF authenticates lazily when this does nothing)."""

    def checked(self, body: dict) -> dict:
        """What body_serializer's is_valid does for this flat body of plain fields."""
        values, errors = {}, {}
        for name, field in self.body_fields.items():
            try:
                values[name] = field.run_validation(body.get(name, fields.empty))
            except fields.SkipField:
                pass
            except exceptions.ValidationError as exc:
                errors[name] = exc.detail
        if errors:
            raise exceptions.ValidationError(errors)
        return values

    @staticmethod
    def apply(digest: str, data: dict) -> Instance:
        """The heartbeat applied; its instance if the token opens it, else AuthenticationFailed."""
        instance = HeartbeatTokenAuthentication.admit(heartbeats.record_heartbeat(
            digest, event_id=data["event_id"], step=data["step"], loss=data["loss"],
            samples_per_s=data["samples_per_s"]))
        if data["trainer_exit_code"] is not None:  # an elastic gang's node waiting for the gang's word
            trainer_exited(instance, exit_code=data["trainer_exit_code"],
                           generation=data["gang_generation"])
        if data["memory_resume_step"] is not None and instance.memory_resume_step is None \
                and instance.state in InstanceState.LIVE:  # said in every heartbeat after; recorded once
            if instance.handover_address:  # a spare that took its noticed VM's notice save
                handover.resumed_from_memory(instance, step=data["memory_resume_step"])
            else:  # a node of a regrouped elastic gang
                resumed_from_memory(instance, step=data["memory_resume_step"], generation=data["gang_generation"])
        return instance

    @staticmethod
    def answer(instance: Instance) -> dict:
        action = services.heartbeat_action(instance)
        return protocol.to_dict(protocol.HeartbeatAnswer(
            action=action,
            checkpoint_interval_s=services.checkpoint_interval_s(instance),
            heartbeat_interval_s=settings.RESPAWN["HEARTBEAT_INTERVAL_S"],
            gang_generation=instance.gang_generation,
            # Asked only with a stop to save for (rare): the hot path pays nothing for it.
            handover=handover.for_instance(instance) if action == protocol.Action.CHECKPOINT_AND_STOP else None,
        ))

    @extend_schema(request=HeartbeatSerializer, responses=inline_serializer("HeartbeatAnswer", {
        "action": serializers.ChoiceField(choices=protocol.Action.ALL),
        "checkpoint_interval_s": serializers.FloatField(),
        "heartbeat_interval_s": serializers.FloatField(),
        "gang_generation": serializers.IntegerField(),
        "handover": serializers.DictField(allow_null=True),
    }))
    def post(self, request):
        digest = agent_token_digest(request)
        try:
            data = self.checked(request.data)
        except exceptions.APIException:
            HeartbeatTokenAuthentication().authenticate(request)  # a wrong token: 401 before 4xx, as on every agent call
            raise
        return Response(self.answer(self.apply(digest, data)))


class NoticeView(AgentView):
    body_serializer = NoticeSerializer

    @extend_schema(request=NoticeSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)
        if data["kind"] == protocol.NoticeKind.REBALANCE:
            record = functools.partial(record_rebalance, self.instance, source=data["source"], raw=data["raw"])
        else:
            record = functools.partial(record_notice, self.instance, source=data["source"],
                                       notice_time=data["notice_time"], deadline=data["deadline"], raw=data["raw"])
        applied = apply_once(self.instance, data["event_id"], "notice", record)
        return ack(duplicate=not applied)


class CheckpointConflict(exceptions.APIException):
    """409, in the API's error shape (respawn_server.jobs.api.errors), naming the checkpoint_id."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, message: str):
        super().__init__({"detail": message, "errors": {"checkpoint_id": [message]}})


class CheckpointsView(AgentView):
    """A committed checkpoint, judged before it is recorded (respawn_server.jobs.api.checkpoint_trust).
    A resend (same checkpoint_id, same step, URI, size and digest) is a duplicate
    whatever its event_id; the same id with anything else is a conflict, never a
    silent keep-the-first."""

    body_serializer = CheckpointReportSerializer
    open_after_end = True

    @extend_schema(request=CheckpointReportSerializer, responses={200: AckSerializer, 409: None})
    def post(self, request):
        data = dict(self.validated(request))
        event_id = data.pop("event_id")
        data.pop("sent_at", None)
        data["committed_at"] = data["committed_at"] or timezone.now()
        problems = {field: [problem] for field, problem in (
            ("uri", checkpoint_trust.uri_problem(data["uri"], self.instance.job)),
            ("step", checkpoint_trust.step_problem(data["step"], self.instance))) if problem}
        if problems:
            raise exceptions.ValidationError(problems)
        self.new = False
        apply_once(self.instance, event_id, "checkpoint", lambda: self.record(data))
        return ack(duplicate=not self.new)

    def record(self, data: dict) -> None:
        checkpoint, self.new = record_checkpoint(self.instance, **data)
        if not self.new:
            if checkpoint.job_id != self.instance.job_id:
                raise CheckpointConflict("This checkpoint_id is already used by another job.")
            differ = [f for f in RESEND_SAME if getattr(checkpoint, f) != data[f]]
            if differ:
                raise CheckpointConflict(f"This checkpoint_id is already recorded with another {', '.join(differ)}: "
                                         "a checkpoint's report is resent unchanged.")
        elif self.instance.state in InstanceState.LIVE:
            refresh_interval(self.instance)  # the measured checkpoint cost just changed


RESEND_SAME = ("step", "uri", "bytes", "manifest_digest")  # what a resent checkpoint report repeats


class ValidationView(AgentView):
    """A verdict on a checkpoint of this instance's job. An ended instance's token judges
    only what it made or resumed from: the live instances' checkpoints are not its own."""

    body_serializer = ValidationReportSerializer
    open_after_end = True

    @extend_schema(request=ValidationReportSerializer, responses=AckSerializer)
    def post(self, request, checkpoint_id):
        data = self.validated(request)
        checkpoints = Checkpoint.objects.filter(checkpoint_id=checkpoint_id, job_id=self.instance.job_id)
        if self.instance.state == InstanceState.ENDED:
            checkpoints = checkpoints.filter(Q(instance=self.instance) | Q(pk=self.instance.resume_checkpoint_id))
        checkpoint = checkpoints.first()
        if checkpoint is None:
            raise exceptions.NotFound("No checkpoint of this job has that checkpoint_id.")
        applied = apply_once(self.instance, data["event_id"], "validation", lambda: record_validation(
            checkpoint, result=data["result"], loss=data["loss"], message=data["message"]))
        return ack(duplicate=not applied)


class LogsView(AgentView):
    body_serializer = LogBatchSerializer
    open_after_end = True

    @extend_schema(request=LogBatchSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)

        def apply():
            LogChunk.objects.bulk_create(
                [LogChunk(instance=self.instance, offset=data["offset"], lines=data["lines"])], ignore_conflicts=True
            )

        applied = apply_once(self.instance, data["event_id"], "logs", apply)
        return ack(duplicate=not applied)


class MetricsView(AgentView):
    """Every step the trainer reported, for the job's loss curve (StepPoint). An ended
    instance's last steps, within its grace window, as its last checkpoint is (a VM
    cancelled as `make demo` stops, or preempted, flushes them on its way down); but
    not a lost or fenced one's: like the heartbeat, the figures of a VM presumed dead,
    whose job resumed elsewhere, are not its job's. A batch with a step beyond the job's
    total_steps is refused whole, as such a checkpoint is."""

    body_serializer = MetricsBatchSerializer
    open_after_end = True
    PRESUMED_DEAD = (EndReason.LOST, EndReason.FENCED)

    @extend_schema(request=MetricsBatchSerializer, responses=AckSerializer)
    def post(self, request):
        instance = self.instance
        if instance.state == InstanceState.ENDED and instance.end_reason in self.PRESUMED_DEAD:
            raise exceptions.AuthenticationFailed(f"Agent token revoked for metrics: the instance ended "
                                                  f"{instance.end_reason}, its job resumed without it.")
        data = self.validated(request)
        if beyond := checkpoint_trust.beyond_total(max(point["step"] for point in data["points"]), instance.job):
            raise exceptions.ValidationError({"points": [f"step {beyond}"]})
        points = [StepPoint(job_id=instance.job_id, instance=instance, **point) for point in data["points"]]
        applied = apply_once(instance, data["event_id"], "metrics",
                             lambda: StepPoint.objects.bulk_create(points, ignore_conflicts=True))
        return ack(duplicate=not applied)


class ExitView(AgentView):
    body_serializer = ExitSerializer
    open_after_end = True

    @extend_schema(request=ExitSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)
        kwargs = {f: data[f] for f in ("reason", "exit_code", "final_step", "output_tail", "last_exception",
                                       "artifact_uri", "artifact_digest")}
        applied = apply_once(self.instance, data["event_id"], "exit",
                             lambda: record_exit(self.instance, **kwargs))
        return ack(duplicate=not applied)


class RendezvousView(AgentView):
    """Rank 0's "host:port" for this instance's gang: on a cloud it is known only once
    rank 0 registers (reports.registration.register_instance), so a rank that registered first
    polls here until it is not empty. An instance reads only its own gang's."""

    @extend_schema(responses=inline_serializer("RendezvousAnswer", {"rendezvous_addr": serializers.CharField()}))
    def get(self, request):
        return Response(protocol.to_dict(protocol.RendezvousAnswer(rendezvous_addr=self.instance.rendezvous_addr)))


class StandbyView(AgentView):
    """A spare (docs/spares.md) polls here once prepared: `standby` while the instance it
    stands by for lives, then, promoted, the checkpoint to resume from, fixed at the
    promotion (recovery.spares.promote_spares). Asking says the spare is ready: once every spare
    of the job is (a gang's every node has one), the instances they stand by for, training
    on through the notice, are told to save and stop (idempotent, as a GET must be). A
    joiner (docs/elastic.md) polls the same way: `standby` until its gang regroups with it,
    then its rank, world size, rendezvous and resume; its asking says it is ready
    (recovery.joiners.joiner_ready). Any other instance reads `standby` false and its own resume
    checkpoint, with where it trains now: a node of an elastic gang asks here after a
    regroup (recovery.elastic.regroup)."""

    @extend_schema(responses=inline_serializer("StandbyAnswer", {
        "standby": serializers.BooleanField(), "resume_from": serializers.CharField(allow_null=True),
        "resume_step": serializers.IntegerField(allow_null=True), "resume_validation": serializers.CharField(),
        "rank": serializers.IntegerField(), "world_size": serializers.IntegerField(),
        "rendezvous_addr": serializers.CharField(), "gang_generation": serializers.IntegerField()}))
    def get(self, request):
        instance = Instance.objects.select_related("resume_checkpoint").get(pk=self.instance.pk)
        if instance.standby_for_id is not None:
            spare_ready(instance)
        elif instance.joining:
            joiner_ready(instance)
        resume = instance.resume_checkpoint
        return Response(protocol.to_dict(protocol.StandbyAnswer(
            standby=instance.standby_for_id is not None or instance.joining, resume_from=resume.uri if resume else None,
            resume_step=resume.step if resume else None, resume_validation=resume.validation if resume else "",
            rank=instance.rank, world_size=instance.world_size, rendezvous_addr=instance.rendezvous_addr,
            gang_generation=instance.gang_generation)))


class HandoverSerializer(ReportSerializer):
    address = serializers.RegexField(r"^[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}$", max_length=259, error_messages={
        "invalid": "must look like host:port (an IPv4 address or a hostname, then the port)"})

    def validate_address(self, address: str) -> str:
        if not 0 < int(address.rpartition(":")[2]) < 65536:
            raise serializers.ValidationError("the port must be 1-65535")
        return address


class HandoverView(AgentView):
    """A spare of a job with the memory tier says where its store listens (docs/memory-tier.md):
    the VM it stands by for hands its notice save there. Any other instance is refused."""

    body_serializer = HandoverSerializer

    @extend_schema(request=HandoverSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)
        instance = Instance.objects.select_related("job").get(pk=self.instance.pk)
        if not handover.wants_handover(instance):
            raise exceptions.PermissionDenied("only a spare standing by for a job with RESPAWN_MEMORY_TIER=on "
                                              "takes a hand-over")
        handover.record(instance, data["address"])
        return ack()


class SourceView(AgentView):
    """The job's source archive, as uploaded (respawn_server.jobs.core.sources); the agent checks it against
    the SHA-256 its job spec pins before unpacking it. 404 when the job has none."""

    @extend_schema(responses={(200, MEDIA_TYPE): OpenApiTypes.BINARY, 404: None})
    def get(self, request):
        archive = self.instance.job.source_archive
        if archive is None:
            raise exceptions.NotFound("This job has no source archive.")
        try:
            return FileResponse(open(sources.stored_path(archive.sha256), "rb"), content_type=MEDIA_TYPE)
        except FileNotFoundError:
            log.error("source archive sha256:%s of job %s is not in storage", archive.sha256, archive.pk)
            raise exceptions.NotFound(f"The source archive sha256:{archive.sha256} is missing from this control "
                                      "plane's storage.") from None


class PrepareReportSerializer(ReportSerializer):
    outcome = serializers.ChoiceField(choices=protocol.PrepareOutcome.ALL)
    key = serializers.RegexField(r"^[0-9a-f]{0,64}$", required=False, allow_blank=True, default="")
    uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    seconds = FiniteFloatField(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_S)
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class PrepareView(AgentView):
    """How the job's prepare step went on this VM: ran (and stored), reused, or failed."""

    body_serializer = PrepareReportSerializer

    @extend_schema(request=PrepareReportSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)
        kwargs = {f: data[f] for f in ("outcome", "key", "uri", "seconds", "message")}
        applied = apply_once(self.instance, data["event_id"], "prepare",
                             lambda: record_prepare(self.instance, **kwargs))
        return ack(duplicate=not applied)


class RegisterFailed(exceptions.APIException):
    """A 5xx: the agent retries a register the server could not answer."""


class RegisterView(APIView):
    """Exchange the single-use bootstrap token for the agent token and the job spec.

    A resend of the same register call (same event_id) after a network fault gets
    a fresh agent token; any other second use of the bootstrap token is refused.

    A register this server fails to answer (a job spec it cannot build) changes
    nothing but a count: the agent retries, and after a bounded number of such
    failures the job fails with cause `setup` (reports.registration.register_failed) instead
    of its VMs timing out unregistered and being relaunched forever."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]
    parser_classes = [CappedJSONParser]

    @extend_schema(request=RegisterSerializer, responses=inline_serializer("RegisterAnswer", {
        "agent_token": serializers.CharField(), "job": serializers.DictField()}))
    def post(self, request):
        body = RegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        token, digest = new_token(AGENT_PREFIX)
        found = None
        try:
            with transaction.atomic():
                instance = found = (
                    Instance.objects.select_for_update()
                    .filter(bootstrap_token_hash=hash_token(data["bootstrap_token"]))
                    .first()
                )
                if instance is None or instance.state not in (InstanceState.REQUESTED, InstanceState.BOOTING,
                                                              InstanceState.RUNNING):
                    raise Unauthorized("Invalid or expired bootstrap token.")
                first_use = instance.register_event_id is None
                if not first_use and instance.register_event_id != data["event_id"]:
                    raise Unauthorized("Bootstrap token already used.")
                Instance.objects.filter(pk=instance.pk).update(agent_token_hash=digest,
                                                               register_event_id=data["event_id"])
                if first_use:
                    register_instance(instance, hostname=data["hostname"],
                                      agent_version=data["agent_version"],
                                      provider_instance_id=data["provider_instance_id"])
                    refresh_interval(instance)
                instance.refresh_from_db()
                answer = protocol.RegisterAnswer(agent_token=token, job=job_spec(instance))
        except exceptions.APIException:
            raise
        except Exception as exc:
            if found is None:
                raise
            log.exception("could not answer the register of instance %s", found.pk)
            failures = register_failed(found.pk, f"{type(exc).__name__}: {exc}")
            raise RegisterFailed(f"The control plane could not answer this register ({type(exc).__name__}): "
                                 f"failure {failures} of the {REGISTER_MAX_FAILURES} after which the job "
                                 "fails.")
        return Response(protocol.to_dict(answer))


def job_spec(instance: Instance) -> protocol.JobSpec:
    job = instance.job
    resume = instance.resume_checkpoint
    post = instance.purpose == protocol.Purpose.POST  # the post step: its own command, from the artifact
    return protocol.JobSpec(
        job_id=job.pk,
        instance_id=instance.pk,
        command=job.post_command if post else job.command,
        working_dir=job.working_dir,
        env=job.env,
        secret_env=secret_env.unseal(job.secret_env),  # here only: the answer to a live instance of the job
        checkpoint_uri=job.storage_uri,
        resume_from=resume.uri if resume else None,
        resume_step=resume.step if resume else None,
        resume_validation=resume.validation if resume else "",
        total_steps=job.total_steps,
        checkpoint_interval_s=services.checkpoint_interval_s(instance),
        checkpoint_every_steps=job.checkpoint_every_steps,
        heartbeat_interval_s=settings.RESPAWN["HEARTBEAT_INTERVAL_S"],
        notice_budget_s=settings.RESPAWN["NOTICE_BUDGET_S"],
        validation=protocol.ValidationSpec(
            enabled=job.validation_enabled and not post,
            model_factory=job.validation_model_factory,
            batch_factory=job.validation_batch_factory,
            eval_fn=job.validation_eval_fn,
            tolerance=job.validation_tolerance,
        ),
        rank=instance.rank,
        world_size=instance.world_size,
        rendezvous_addr=instance.rendezvous_addr,
        elastic=job.elastic and not post,
        gang_generation=instance.gang_generation,
        prepare_command=job.prepare_command,
        prepare_inputs=job.prepare_inputs,
        purpose=instance.purpose,
        artifact_uri=job.artifact_uri if post else "",
        artifact_digest=job.artifact_digest if post else "",
        source_sha256=job.source_archive.sha256 if job.source_archive_id else "",
        source_max_unpacked_bytes=sources.max_bytes() if job.source_archive_id else None,
        source_git_url=job.source_git_url,
        source_git_commit=job.source_git_commit,
        run_id=trackers.run_id(job),
        container_image=job.container_image,
        standby=instance.standby_for_id is not None or instance.joining,
        notice_hold=not post,  # a training VM's notice launches spares (reports.notices.record_notice)
        spare_on_rebalance=job.spare_on_rebalance and job.nodes == 1 and not post,
        handover_token=handover.token_for(instance.pk) if handover.wants_handover(instance) else "",
    )
