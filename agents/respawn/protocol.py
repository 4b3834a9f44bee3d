"""The agent <-> control plane wire schema (DESIGN §5), shared by both sides.

Plain dataclasses, no Django: the agent builds and sends these, the control plane's
serializers validate the same field names. Every report carries `event_id` (a UUID
the agent makes once and keeps across resends) and `sent_at` (agent clock, ISO 8601).
Unknown fields are ignored on both sides so either side can add fields first.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

API_PREFIX = "/api/agent/v1/"

# Paths under API_PREFIX. `{checkpoint_id}` is the client-made UUID.
# Marks the agent's own lines in a job's output (respawn.agent.joblog).
AGENT_LINE_PREFIX = "[respawn-agent]"

PATH_REGISTER = "register"
PATH_HEARTBEAT = "heartbeat"
PATH_NOTICE = "notice"
PATH_CHECKPOINTS = "checkpoints"
PATH_VALIDATION = "checkpoints/{checkpoint_id}/validation"
PATH_LOGS = "logs"
PATH_METRICS = "metrics"  # every step's loss and speed, in batches (the heartbeat carries only the latest)
PATH_EXIT = "exit"
PATH_PREPARE = "prepare"
PATH_RENDEZVOUS = "rendezvous"  # GET: rank 0's address, for a rank that registered before rank 0 did
PATH_STANDBY = "standby"  # GET: whether a spare still waits, and once promoted the checkpoint it resumes from
PATH_HANDOVER = "handover"  # POST: a spare's store (docs/memory-tier.md), that its noticed VM hands its state to
PATH_SOURCE = "source"  # GET: the job's source archive (agents/respawn/sourcetree.py), whose SHA-256 the job spec pins

MAX_LOG_LINES_PER_BATCH = 1000
MAX_LOG_LINE_CHARS = 4096
MAX_METRIC_POINTS_PER_BATCH = 1000  # and the agent sends at most one batch per heartbeat interval
MAX_OUTPUT_TAIL_CHARS = 16384
MAX_RAW_PAYLOAD_CHARS = 16384


class Action:
    """What a heartbeat answer tells the agent to do."""

    CONTINUE = "continue"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_AND_STOP = "checkpoint_and_stop"
    STOP = "stop"
    # To a VM holding a notice (JobSpec.notice_hold): its spare is launching, so train on until
    # checkpoint_and_stop, at the latest when only the save's budget is left (docs/spares.md).
    HOLD = "hold"
    ALL = (CONTINUE, CHECKPOINT, CHECKPOINT_AND_STOP, STOP, HOLD)


class CheckpointKind:
    PERIODIC = "periodic"
    NOTICE = "notice"
    FINAL = "final"
    ALL = (PERIODIC, NOTICE, FINAL)


class CheckpointTier:
    """Where a committed checkpoint's step is held (DESIGN §12): always storage; the memory
    tier too when every rank's replica of that step was whole in the gang's buddy stores
    as it committed (a newer replication settling drops it there later)."""
    STORAGE = "storage"
    MEMORY = "memory"
    ALL = (STORAGE, MEMORY)


class ValidationResult:
    PENDING = "pending"
    VALID = "valid"
    INVALID = "invalid"
    SKIPPED = "skipped"  # nothing to check with (the job names no validation factories); the message says why
    ERROR = "error"  # the check itself failed (an eval_fn that raised or returned a non-finite number, a factory
    # that cannot be used): the message names the cause; the checkpoint is neither trusted nor condemned
    ALL = (PENDING, VALID, INVALID, SKIPPED, ERROR)
    FROM_AGENT = (VALID, INVALID, ERROR)


class NoticeSource:
    AWS_IMDS = "aws_imds"
    GCP_METADATA = "gcp_metadata"
    AZURE_SCHEDULED_EVENTS = "azure_scheduled_events"
    SIGTERM = "sigterm"
    LOCAL = "local"
    # Sources the control plane itself records (never sent by an agent).
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    PROVIDER_API = "provider_api"
    FROM_AGENT = (AWS_IMDS, GCP_METADATA, AZURE_SCHEDULED_EVENTS, SIGTERM, LOCAL)
    ALL = FROM_AGENT + (HEARTBEAT_TIMEOUT, PROVIDER_API)


class NoticeKind:
    PREEMPT = "preempt"  # the VM is being reclaimed: save and stop within the window
    # AWS's earlier, softer signal: elevated risk, no deadline. Reported to the control plane
    # only for a job with spare_on_rebalance, which then moves it onto a spare (docs/spares.md).
    REBALANCE = "rebalance"
    ALL = (PREEMPT, REBALANCE)


class ExitReason:
    """Why the agent's trainer ended, as the agent saw it."""

    COMPLETED = "completed"  # trainer exited 0 with the job done
    FAILED = "failed"  # trainer exited non-zero on its own: the user's code
    PREEMPTED = "preempted"  # stopped because of a preemption notice
    STOPPED = "stopped"  # stopped because the control plane said so (cancel, fence)
    SETUP = "setup"  # could not start the trainer (missing command, prepare failed)
    ALL = (COMPLETED, FAILED, PREEMPTED, STOPPED, SETUP)


class Purpose:
    """What an instance is for: the job's training, or its post step (evaluation or
    export on one on-demand VM after training succeeded, from the job's artifact)."""

    TRAIN = "train"
    POST = "post"
    ALL = (TRAIN, POST)


class PrepareOutcome:
    """How the prepare step went on one VM (reported with `POST prepare`)."""

    RAN = "ran"  # the command ran and its outputs were stored under their key
    REUSED = "reused"  # outputs under this key were already stored: fetched, the command skipped
    FAILED = "failed"  # the command failed, an input is missing, or storage refused
    ALL = (RAN, REUSED, FAILED)


def new_event_id() -> str:
    return str(uuid.uuid4())


def utcnow_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass(kw_only=True)
class Report:
    """Base of every agent -> control plane body."""

    event_id: str = field(default_factory=new_event_id)
    sent_at: str = field(default_factory=utcnow_iso)


@dataclass(kw_only=True)
class Register(Report):
    bootstrap_token: str
    provider_instance_id: str = ""
    hostname: str = ""
    agent_version: str = ""


@dataclass(kw_only=True)
class ValidationSpec:
    enabled: bool = True
    model_factory: str = ""  # "module:function" returning an nn.Module
    batch_factory: str = ""  # "module:function" returning a fixed-seed batch: (inputs, targets) or a dict of kwargs
    eval_fn: str = ""  # "module:function", eval_fn(model, batch) -> float; empty: the checkpoint's own, else the default loss
    tolerance: float = 1e-4


@dataclass(kw_only=True)
class JobSpec:
    job_id: int
    instance_id: int
    command: list[str]
    working_dir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # Set for the trainer like env, but never written to a log or report by the agent.
    secret_env: dict[str, str] = field(default_factory=dict)
    checkpoint_uri: str = ""  # storage prefix for this job's checkpoints
    resume_from: str | None = None  # URI of the checkpoint to resume from, if any
    resume_step: int | None = None
    resume_validation: str = ""  # the control plane's verdict on `resume_from` (a ValidationResult), for the log
    total_steps: int | None = None
    checkpoint_interval_s: float | None = None
    checkpoint_every_steps: int | None = None
    heartbeat_interval_s: float = 10.0
    notice_budget_s: float = 25.0
    validation: ValidationSpec = field(default_factory=ValidationSpec)
    rank: int = 0
    world_size: int = 1
    rendezvous_addr: str = ""  # "host:port" of rank 0; empty for single-node jobs
    # An elastic gang (docs/elastic.md): when its trainer exits on its own, the agent reports that in
    # its heartbeats and waits for the gang's word rather than exiting. A heartbeat answer naming
    # another gang_generation (a node lost, or one joining) makes it ask `standby` for its new rank,
    # world size, rendezvous and resume checkpoint, and restart the trainer with them.
    elastic: bool = False
    gang_generation: int = 0
    # Run before `command` (agents/respawn/agent/prepare.py); outputs cached under
    # `<checkpoint_uri>/prepare/<key>/`, key = content hash of the command and inputs.
    prepare_command: list[str] = field(default_factory=list)
    prepare_inputs: list[str] = field(default_factory=list)  # paths (relative to working_dir) hashed into the key
    purpose: str = Purpose.TRAIN  # "post": `command` is the job's post command
    artifact_uri: str = ""  # the job's exported artifact (post instances only)
    artifact_digest: str = ""
    # The job's code, put into working_dir before prepare and training (agents/respawn/agent/source.py):
    # the archive `GET source` serves, checked against this hex SHA-256, or a git commit.
    source_sha256: str = ""
    # The limit the control plane checked the archive against at upload (agents/respawn/sourcetree.py):
    # the VM unpacks under the same one. None (an older control plane): headers bounded only.
    source_max_unpacked_bytes: int | None = None
    source_git_url: str = ""
    source_git_commit: str = ""
    # The job's experiment-tracker run id, the same for every VM of the job (agents/respawn/trackers.py).
    run_id: str = ""
    # OCI image the trainer runs in (agents/respawn/agent/container.py); empty: the VM's own Python.
    container_image: str = ""
    # A spare launched on another VM's notice (docs/spares.md), or a joiner launched to grow an
    # elastic gang back (docs/elastic.md): prepare, then poll `standby` and start the trainer
    # only once promoted, where and from the checkpoint that answer names.
    standby: bool = False
    # On a notice whose window leaves more than notice_budget_s, train on a few seconds for the
    # control plane's word: `hold` (a spare is launching) keeps training until checkpoint_and_stop
    # or until only that budget is left; no word, and it saves as without a spare.
    notice_hold: bool = False
    # On an AWS rebalance recommendation, report it (Notice kind rebalance) and train on: the
    # control plane launches a spare and, once it is ready, asks this VM to checkpoint_and_stop.
    spare_on_rebalance: bool = False
    # A spare of a job with the memory tier (docs/memory-tier.md): the token of the store it runs
    # while it stands by, into which the noticed VM hands its notice save (Handover); empty: none.
    handover_token: str = ""


@dataclass(kw_only=True)
class RegisterAnswer:
    agent_token: str
    job: JobSpec


@dataclass(kw_only=True)
class Heartbeat(Report):
    step: int = 0
    loss: float | None = None
    samples_per_s: float | None = None
    last_checkpoint_step: int | None = None
    checkpoint_save_s: float | None = None  # last save, snapshot to commit
    checkpoint_stall_s: float | None = None  # last save, training blocked
    # An elastic gang's node whose trainer exited with this code, in gang_generation: it waits for
    # the control plane to regroup the gang (a peer was lost) or to stop it (the code failed).
    trainer_exit_code: int | None = None
    gang_generation: int = 0
    # The step this node's trainer resumed at from the gang's memory tier (docs/memory-tier.md),
    # newer than the checkpoint the control plane named; with the gang_generation it trains in.
    memory_resume_step: int | None = None


@dataclass(kw_only=True)
class HeartbeatAnswer:
    action: str = Action.CONTINUE
    checkpoint_interval_s: float | None = None
    heartbeat_interval_s: float | None = None
    gang_generation: int = 0  # the form of an elastic gang this node is to train in (JobSpec.elastic)
    # With checkpoint_and_stop for a VM whose spare is ready and runs a store (docs/memory-tier.md):
    # {"address": "host:port", "token", "node"}, where its notice save goes beside storage.
    handover: dict | None = None


@dataclass(kw_only=True)
class Handover(Report):
    """A spare's store, listening: `address` is "host:port" (its noticed VM reaches it there)."""

    address: str


@dataclass(kw_only=True)
class StandbyAnswer:
    standby: bool = False  # still waiting: for the instance it stands by for to end, or for its gang to grow
    resume_from: str | None = None  # once promoted: as JobSpec's
    resume_step: int | None = None
    resume_validation: str = ""
    # Where the instance trains now (JobSpec's fields): what an elastic gang's regroup changed.
    rank: int = 0
    world_size: int = 1
    rendezvous_addr: str = ""
    gang_generation: int = 0


@dataclass(kw_only=True)
class RendezvousAnswer:
    rendezvous_addr: str = ""  # "host:port" of rank 0; empty until rank 0 registers


@dataclass(kw_only=True)
class Notice(Report):
    source: str
    notice_time: str  # when the cloud (or signal) announced it
    deadline: str | None = None  # when the VM goes away, as the cloud states it
    raw: str = ""  # the payload as received, truncated to MAX_RAW_PAYLOAD_CHARS
    kind: str = NoticeKind.PREEMPT


@dataclass(kw_only=True)
class CheckpointReport(Report):
    checkpoint_id: str
    step: int
    uri: str
    bytes: int
    manifest_digest: str
    kind: str = CheckpointKind.PERIODIC
    committed_at: str | None = None
    save_s: float | None = None
    stall_s: float | None = None
    reference_loss: float | None = None
    persist_s: float | None = None  # save_s less its pacing: about what it takes after a notice
    notice_window_s: float | None = None  # set by the agent: the notice its cloud gives (None: unknown)
    tiers: list[str] = field(default_factory=lambda: [CheckpointTier.STORAGE])  # as its manifest records them


@dataclass(kw_only=True)
class ValidationReport(Report):
    result: str
    loss: float | None = None
    reference_loss: float | None = None
    message: str = ""


@dataclass(kw_only=True)
class LogBatch(Report):
    offset: int  # index of the first line in the instance's output
    lines: list[str]


@dataclass(kw_only=True)
class StepMetric:
    step: int
    time: str  # the trainer's clock (ISO 8601) when it reported the step
    loss: float | None = None
    samples_per_s: float | None = None


@dataclass(kw_only=True)
class MetricsBatch(Report):
    points: list[StepMetric]  # at most MAX_METRIC_POINTS_PER_BATCH, in the order the trainer reported them


@dataclass(kw_only=True)
class ExitReport(Report):
    reason: str
    exit_code: int | None = None
    final_step: int | None = None
    output_tail: str = ""
    last_exception: str = ""  # last exception line of the trainer's output, if any
    artifact_uri: str = ""
    artifact_digest: str = ""


@dataclass(kw_only=True)
class PrepareReport(Report):
    outcome: str  # a PrepareOutcome
    key: str = ""  # the content hash the outputs are stored under
    uri: str = ""  # where they are stored (empty when not stored, e.g. on ranks > 0)
    seconds: float | None = None  # the step's wall time on this VM
    message: str = ""  # what went wrong, for `failed`


@dataclass(kw_only=True)
class Ack:
    ok: bool = True
    duplicate: bool = False


T = TypeVar("T")


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build `cls` from a decoded JSON object, ignoring fields it does not know."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            continue
        if key == "job" and isinstance(value, dict):
            value = from_dict(JobSpec, value)
        elif key == "validation" and isinstance(value, dict):
            value = from_dict(ValidationSpec, value)
        kwargs[key] = value
    return cls(**kwargs)


# --- The agent <-> trainer channel on the VM -------------------------------------
# The agent starts the trainer with these environment variables; the checkpoint
# library and `respawn.trainer` read them, so a training script needs no flags.
ENV_CHECKPOINT_URI = "RESPAWN_CHECKPOINT_URI"  # storage root for this job's checkpoints
ENV_RESUME_FROM = "RESPAWN_RESUME_FROM"  # URI of the checkpoint to resume from (may be unset)
ENV_CHECKPOINT_INTERVAL_S = "RESPAWN_CHECKPOINT_INTERVAL_S"
ENV_STATUS_FILE = "RESPAWN_STATUS_FILE"  # trainer -> agent: JSON {step, loss, samples_per_s, ...}, replaced atomically;
# "stopped": true once the trainer stopped on a stop request (in a gang, possibly another rank's);
# "memory_resume_step": the step it resumed at from the memory tier, in every status it writes after
ENV_METRICS_FILE = "RESPAWN_METRICS_FILE"  # trainer -> agent: JSONL, one {step, loss, samples_per_s, time} per step
ENV_CHECKPOINTS_FILE = "RESPAWN_CHECKPOINTS_FILE"  # trainer -> agent: JSONL, one CheckpointReport-shaped record per commit
# trainer -> agent: JSONL, one ValidationReport-shaped record (with its checkpoint_id) per verdict the trainer
# reached itself: the checkpoint it resumes from, the final one before exporting it
ENV_VALIDATIONS_FILE = "RESPAWN_VALIDATIONS_FILE"
ENV_CONTROL_FILE = "RESPAWN_CONTROL_FILE"  # agent -> trainer: JSON {checkpoint_interval_s}, replaced atomically
ENV_NOTICE_FILE = "RESPAWN_NOTICE_FILE"  # agent -> trainer: JSON {source, notice_time, deadline, handover?}, written before the stop signal
# trainer -> agent: a directory where each training process that handles the agent's signals (the
# library does it: agents/respawn/checkpoint/signals.py) puts a file named by its pid. The agent's signals go
# to those processes alone, never to their process group, whose DataLoader workers would die of them.
ENV_SIGNAL_TARGETS_DIR = "RESPAWN_SIGNAL_TARGETS_DIR"
ENV_VALIDATION_MODEL_FACTORY = "RESPAWN_MODEL_FACTORY"
ENV_VALIDATION_BATCH_FACTORY = "RESPAWN_BATCH_FACTORY"
ENV_VALIDATION_EVAL_FN = "RESPAWN_EVAL_FN"
ENV_TOTAL_STEPS = "RESPAWN_TOTAL_STEPS"
ENV_PREPARE_DIR = "RESPAWN_PREPARE_DIR"  # the prepare step writes its outputs here; the trainer reads them here
ENV_PREPARE_URI = "RESPAWN_PREPARE_URI"  # where those outputs are stored durably (set once the step is done)
ENV_ARTIFACT_URI = "RESPAWN_ARTIFACT_URI"  # post step: the job's exported artifact
ENV_ARTIFACT_DIGEST = "RESPAWN_ARTIFACT_DIGEST"  # post step: its digest ("sha256:<hex>")
# Gangs use torch.distributed's own variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
# The job's experiment-tracker run (agents/respawn/trackers.py): the same on every VM of the job, and the
# tag an MLflow run carries so that every VM finds the one the first made.
ENV_RUN_ID = "RESPAWN_RUN_ID"
# The memory tier (docs/memory-tier.md), a multi-node job's: agent -> trainer, this node's buddy store
# ("host:port", bound to the address the gang reaches this node at) and its token, which the ranks
# exchange on their own group. Absent: no memory tier. ENV_REPLICA_EVERY_STEPS (the job's env, optional):
# replicate every this many steps instead of the K chosen from the measured cost.
# ENV_MEMORY_TIER (the job's env): "on" asks for the tier; without it no store runs and nothing
# replicates (a price in step time and host memory that docs/memory-tier.md measures).
ENV_MEMORY_TIER = "RESPAWN_MEMORY_TIER"
ENV_MEMORY_TIER_ADDR = "RESPAWN_MEMORY_TIER_ADDR"
ENV_MEMORY_TIER_TOKEN = "RESPAWN_MEMORY_TIER_TOKEN"
ENV_REPLICA_EVERY_STEPS = "RESPAWN_REPLICA_EVERY_STEPS"
MLFLOW_RUN_TAG = "respawn_run_id"

# Signals the agent sends the trainer. Handlers only set a flag; the save happens
# at the next safe point of the training loop.
SIGNAL_CHECKPOINT_AND_STOP = "SIGTERM"
SIGNAL_CHECKPOINT_NOW = "SIGUSR1"
