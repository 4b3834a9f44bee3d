"""The core's tables: teams, jobs and their instances (one VM lifetime each), the
checkpoints they commit, the events of each, and the audit log. Status fields change
only through `respawn_server.jobs.core.transitions`, which guards every update with the
expected old state."""

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Case, F, Q, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from respawn_server.jobs.core.choices import (
    CHECKPOINT_KIND_CHOICES,
    MARKET_CHOICES,
    NOTICE_SOURCE_CHOICES,
    PURPOSE_CHOICES,
    VALIDATION_CHOICES,
    AuditAction,
    CheckpointKind,
    CheckpointTier,
    EndReason,
    FailureCause,
    InstanceState,
    InterruptionKind,
    JobStatus,
    Market,
    Purpose,
    ValidationResult,
)


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    monthly_budget_usd = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    max_concurrent_gpus = models.PositiveIntegerField(null=True, blank=True)
    # Set by deployment staff (Django admin); team admins set the limits above within them.
    budget_ceiling_usd = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True,
        help_text="The highest monthly budget the team's admins may set; empty: they may only lower it.")
    gpu_ceiling = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The most concurrent GPUs the team's admins may allow; empty: they may only lower the limit.")
    budget_warning = models.CharField(
        max_length=300, blank=True, help_text="Set by the reconciler while the month's projected spend exceeds the budget."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class SourceArchive(models.Model):
    """A job's code as uploaded: a deterministic tar.gz of a working directory, named by
    its SHA-256 (agents/respawn/sourcetree.py). A team's row says it uploaded these bytes, so a
    job may name them; the bytes are stored once per digest (respawn_server.jobs.core.sources), and a
    tree submitted again is not uploaded again."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="source_archives")
    sha256 = models.CharField(max_length=64, help_text="Hex SHA-256 of the archive's bytes.")
    bytes = models.PositiveBigIntegerField()
    unpacked_bytes = models.PositiveBigIntegerField(help_text="Sum of its files' sizes.")
    files = models.PositiveIntegerField()
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "sha256"], name="source_archive_team_sha256_unique")]

    def __str__(self):
        return f"sha256:{self.sha256[:12]}… of {self.team}"


class Job(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)

    # What to run.
    command = models.JSONField(help_text="argv list of the training command.")
    working_dir = models.CharField(max_length=500, blank=True)
    # Two different things (DESIGN §11): what the VM boots, per cloud, and what the trainer runs in.
    machine_image = models.JSONField(
        default=dict, blank=True, help_text="Boot image per cloud: {\"aws\": \"ami-…\", \"gcp\": "
        "\"projects/…/global/images/…\", \"azure\": \"publisher:offer:sku:version\"}; a cloud not named boots "
        "its provider's default image.")
    container_image = models.CharField(
        max_length=300, blank=True, help_text="OCI image the trainer runs in (podman or docker on the VM); empty: "
        "the VM's own Python.")
    env = models.JSONField(default=dict, blank=True)
    # Names in the clear, each value a Fernet token (respawn_server.jobs.core.secret_env): decrypted only
    # for the register answer to one of the job's live instances (DESIGN §11).
    secret_env = models.JSONField(
        default=dict, blank=True, help_text="Secret environment: names to encrypted values, never plaintext.")
    prepare_command = models.JSONField(
        default=list, blank=True, help_text="argv run before the command; its outputs are cached by content hash.")
    prepare_inputs = models.JSONField(
        default=list, blank=True, help_text="Paths (relative to working_dir) whose contents key the prepare cache.")
    post_command = models.JSONField(
        default=list, blank=True, help_text="argv run on one on-demand VM after training succeeded, from the artifact.")
    # The code the VM unpacks (or checks out) into working_dir before prepare and training.
    source_archive = models.ForeignKey(SourceArchive, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="jobs")
    source_git_url = models.CharField(max_length=500, blank=True)
    source_git_commit = models.CharField(max_length=64, blank=True, help_text="Full commit id checked out.")

    # Where to run it.
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)],
                                        help_text="Nodes of the gang; for an elastic gang, the most it runs on.")
    nodes_min = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Elastic gangs (docs/elastic.md): the fewest nodes the gang trains on. A node lost with at least "
                  "this many left, the survivors go on from the newest checkpoint, resharded; empty: always all.")
    accelerator = models.CharField(max_length=50, blank=True)
    accelerator_count = models.PositiveIntegerField(default=1)
    instance_types = models.JSONField(default=list, blank=True)
    allowed_clouds = models.JSONField(default=list, blank=True)
    allowed_regions = models.JSONField(default=list, blank=True)
    max_price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    on_demand_after_preemptions = models.PositiveIntegerField(
        null=True, blank=True, help_text="Fall back to on-demand after this many preemptions; never when empty."
    )
    deadline = models.DateTimeField(null=True, blank=True)
    spare_on_rebalance = models.BooleanField(
        default=False, help_text="On an AWS rebalance recommendation, launch a spare and move a one-node job onto it "
                                 "once it is ready (docs/spares.md).")
    priority = models.IntegerField(default=0)

    # Training and checkpoints.
    total_steps = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_uri = models.CharField(max_length=500, blank=True)
    checkpoint_interval_s = models.FloatField(null=True, blank=True, help_text="Override; policy-chosen when empty.")
    checkpoint_every_steps = models.PositiveIntegerField(null=True, blank=True)
    validation_enabled = models.BooleanField(default=True)
    validation_model_factory = models.CharField(max_length=200, blank=True)
    validation_batch_factory = models.CharField(max_length=200, blank=True)
    validation_eval_fn = models.CharField(
        max_length=200, blank=True, help_text="module:function, eval_fn(model, batch) -> float; empty: the one the "
        "script stored in its checkpoints, else the default loss (cross-entropy, causal-LM cross-entropy, MSE, the "
        "model output's own loss).")
    validation_tolerance = models.FloatField(default=1e-4)

    # State.
    status = models.CharField(max_length=20, choices=JobStatus.CHOICES, default=JobStatus.QUEUED, db_index=True)
    # Text, not a bounded string: a reason quoting an exception line must not be cut mid-message.
    status_reason = models.TextField(blank=True, help_text="Why it waits, or what happened last.")
    failure_cause = models.CharField(max_length=20, choices=FailureCause.CHOICES, blank=True)
    failure_message = models.TextField(blank=True)
    preemptions = models.PositiveIntegerField(default=0)
    max_preemptions = models.PositiveIntegerField(null=True, blank=True)
    failure_restarts = models.PositiveIntegerField(default=0)
    max_restarts = models.PositiveIntegerField(default=2)
    last_failure_signature = models.TextField(blank=True)  # "exit N: <last exception line>", whole
    last_step = models.PositiveBigIntegerField(default=0)
    newest_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    newest_valid_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    artifact_uri = models.CharField(max_length=500, blank=True)
    artifact_digest = models.CharField(max_length=200, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "status"], name="job_team_status_idx")]

    def __str__(self):
        return f"job {self.pk} {self.name}"

    @property
    def elastic(self) -> bool:
        """Whether the gang may go on with fewer nodes than it asked for."""
        return self.nodes_min is not None and self.nodes_min < self.nodes

    @property
    def storage_uri(self) -> str:
        """Each job checkpoints under its own prefix of the storage root (DESIGN §6)."""
        return f"{self.checkpoint_uri.rstrip('/')}/job-{self.pk}"

    @property
    def failure_headline(self) -> str:
        return failure_headline(self.failure_message)


FAILURE_MESSAGE_CHARS = 8000


def failure_message(headline: str, output_tail: str = "") -> str:
    """A failed job's message: its one-line headline (for the user's code, the exit
    code and last exception line), then as much of the output's end as fits. The
    headline is what the job page and the API show first, so it is never the part cut."""
    kept = output_tail[max(0, len(output_tail) - (FAILURE_MESSAGE_CHARS - len(headline) - 1)):]
    return f"{headline}\n{kept}" if kept else headline


def failure_headline(message: str) -> str:
    """The headline `failure_message` wrote first."""
    return message.partition("\n")[0]


def resume_step_of(row) -> int | None:
    """The step an instance's run or a regroup (a row with `resume_checkpoint` and
    `memory_resume_step`) went on from: the memory tier's step where it resumed from there
    (newer than the checkpoint named), else the checkpoint's; None: from the start.
    RESUME_STEP and RESUMED_FROM_WRITER are the same rule for a query."""
    if row.memory_resume_step is not None:
        return row.memory_resume_step
    return row.resume_checkpoint.step if row.resume_checkpoint else None


RESUME_STEP = Coalesce("memory_resume_step", "resume_checkpoint__step")
# The instance whose checkpoint the run went on from; none for a memory-tier resume (no writer holds that step).
RESUMED_FROM_WRITER = Case(When(memory_resume_step__isnull=True, then=F("resume_checkpoint__instance_id")))


class WorldSize(models.Model):
    """A job's world size from a moment on (DESIGN §11): each gang placed, each regroup of
    an elastic gang. The job page plots them."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="world_sizes")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    world_size = models.PositiveIntegerField()
    reason = models.TextField(blank=True)
    # A regroup's: the node whose loss caused it, and the checkpoint every node resumed from.
    after_instance = models.ForeignKey("Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    resume_checkpoint = models.ForeignKey("Checkpoint", null=True, blank=True, on_delete=models.SET_NULL,
                                          related_name="+")
    gang_generation = models.PositiveIntegerField(
        default=0, help_text="A regroup's: the generation its nodes train in from then on (Instance.gang_generation).")
    memory_resume_step = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="A regroup's: the step its nodes' trainers resumed at from the gang's memory "
                                         "tier, newer than resume_checkpoint (docs/memory-tier.md); empty: from that "
                                         "checkpoint.")

    @property
    def resume_step(self) -> int | None:
        """The step the gang went on from, whichever tier held it; None: from the start."""
        return resume_step_of(self)

    @property
    def resume_tier(self) -> str:
        """"memory", "storage", or "" (from the start)."""
        if self.memory_resume_step is not None:
            return "memory"
        return "storage" if self.resume_checkpoint else ""

    class Meta:
        ordering = ["at", "id"]


class JobEvent(models.Model):
    """One row per status change (and other notable happenings) of a job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_status = models.CharField(max_length=20, blank=True)
    to_status = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)  # whole: its sources bound their own parts (e.g. an exception line)

    class Meta:
        ordering = ["created_at", "id"]


class Instance(models.Model):
    """One VM lifetime of one node slot (rank) of a job."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="instances")
    # The rank and world size its trainer started with; an elastic gang's regroup restarts
    # the trainer with new ones and a new generation (services.regroup).
    rank = models.PositiveIntegerField(default=0)
    world_size = models.PositiveIntegerField(default=1)
    gang_generation = models.PositiveIntegerField(
        default=0, help_text="Which form of its elastic gang the instance trains in; raised at each regroup, and the "
                             "agent restarts its trainer when its heartbeat answer names another.")
    earlier_runs = models.JSONField(
        default=list, blank=True, help_text="An elastic gang's node: the runs its VM trained before each regroup, "
        "oldest first, each {rank, resume_step, resume_from (the instance that wrote it; null for a memory-tier "
        "resume), last_step, kept_until (the step the regroup resumed from, whichever tier held it), until, regroup "
        "(the gang generation the regroup that ended it began)}; the "
        "money counts the work each kept (respawn_server.jobs.money.costs). rank, resume_checkpoint and last_step are the run now.")
    trainer_exited_at = models.DateTimeField(
        null=True, blank=True, help_text="An elastic gang's node whose trainer exited (a peer gone, or its code): its "
                                         "agent waits for the gang's word, a regroup or a stop, and this is cleared "
                                         "at a regroup.")
    purpose = models.CharField(max_length=10, choices=PURPOSE_CHOICES, default=Purpose.TRAIN,
                               help_text="train, or post: the job's post step on one on-demand VM.")
    provider = models.CharField(max_length=20)
    region = models.CharField(max_length=50, blank=True)
    zone = models.CharField(max_length=50, blank=True)
    instance_type = models.CharField(max_length=50)
    market = models.CharField(max_length=10, choices=MARKET_CHOICES, default=Market.SPOT)
    provider_instance_id = models.CharField(max_length=200, blank=True, db_index=True)
    client_token = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    price_per_hour_at_launch = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)

    state = models.CharField(max_length=12, choices=InstanceState.CHOICES, default=InstanceState.REQUESTED)
    end_reason = models.CharField(max_length=20, choices=EndReason.CHOICES, blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    running_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    bootstrap_token_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    register_event_id = models.UUIDField(null=True, blank=True)
    agent_token_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    hostname = models.CharField(max_length=200, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    rendezvous_addr = models.CharField(max_length=200, blank=True)
    resume_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    memory_resume_step = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The step its trainer resumed at from the gang's memory tier, newer than "
                                         "resume_checkpoint (its run now; a regroup clears it).")
    handover_address = models.CharField(
        max_length=200, blank=True, help_text="A spare's memory-tier store (host:port, docs/memory-tier.md) that the "
                                              "instance it stands by for hands its notice save to.")

    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_deadline = models.DateTimeField(null=True, blank=True)
    last_step = models.PositiveBigIntegerField(default=0)
    checkpoint_interval = models.JSONField(
        null=True, blank=True, help_text="The interval this instance is told and its inputs (jobs.placement.interval_for)."
    )
    requested_action = models.CharField(max_length=24, blank=True)
    requested_action_at = models.DateTimeField(null=True, blank=True)
    register_failures = models.PositiveIntegerField(
        default=0, help_text="Registers of this VM the control plane failed to answer (a server error).")
    preemption_confirmed = models.BooleanField(
        null=True, help_text="For an instance ended preempted: whether the cloud confirmed it (the VM was gone or "
                             "stopped before we terminated it); empty until asked. Only confirmed preemptions feed "
                             "the interruption rates every team's placement uses.")

    standby_for = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="spares",
        help_text="A spare launched on this instance's notice (docs/spares.md): it boots and prepares but holds no "
                  "node slot and trains nothing until that instance has ended; then it is promoted (this is "
                  "cleared). Kept on a spare that ended before that.")
    joining = models.BooleanField(
        default=False, help_text="A joiner (docs/elastic.md): launched to grow an elastic gang back to its full size; "
                                 "it boots and prepares but trains nothing until the gang, at its next checkpoint, "
                                 "regroups with it (this is then cleared). Kept on a joiner that ended before.")
    standby_ready_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When this spare or joiner, booted and prepared, first asked whether it may train. The instances "
                  "spares stand by for are told to save and stop once every spare of the job is ready: a gang hands "
                  "over whole; an elastic gang is asked to checkpoint once every joiner is.")
    # A spot VM the cloud stops rather than deletes on eviction (Azure, eviction policy
    # Deallocate) keeps its disk, billed until the VM is deleted.
    stopped_disk_sku = models.CharField(
        max_length=50, blank=True,
        help_text="Price SKU of the disk this VM keeps while stopped (e.g. 'P10 LRS'); empty when an eviction "
                  "leaves nothing billed. Recorded at launch.")
    storage_released_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the control plane saw the evicted VM and its disk deleted; the disk bills until then.")

    class Meta:
        ordering = ["requested_at", "id"]
        constraints = [
            # A job has at most one live instance per node slot (DESIGN §3).
            # A spare holds no slot until promoted, and promoting it while the instance it
            # stands by for still lives breaks this constraint: never two trainers per slot.
            models.UniqueConstraint(
                fields=["job", "rank"],
                condition=Q(state__in=sorted(InstanceState.LIVE), standby_for__isnull=True),
                name="instance_one_live_per_slot",
            ),
            models.UniqueConstraint(
                fields=["job", "rank"],
                condition=Q(state__in=sorted(InstanceState.LIVE), standby_for__isnull=False),
                name="instance_one_live_spare_per_slot",
            ),
        ]
        indexes = [
            # The reconciler's "overdue, oldest first" over live instances only.
            models.Index(
                fields=["heartbeat_deadline"],
                condition=Q(state__in=sorted(InstanceState.LIVE)),
                name="instance_live_deadline_idx",
            ),
            # The reconciler's sweep of evicted VMs whose disk still bills (few rows, asked each period).
            models.Index(fields=["ended_at"], condition=Q(storage_released_at__isnull=True) & ~Q(stopped_disk_sku="")
                         & Q(end_reason=EndReason.PREEMPTED), name="instance_disk_unreleased_idx"),
        ]

    # The instances whose stopped disk bills after their end: evicted (ended preempted)
    # with a disk the cloud keeps. respawn_server.jobs.money.costs prices them; reconcile deletes their VM.
    DISK_KEPT = Q(end_reason=EndReason.PREEMPTED) & ~Q(stopped_disk_sku="")

    def __str__(self):
        return f"instance {self.pk} of job {self.job_id} rank {self.rank}"

    @property
    def disk_kept(self) -> bool:
        """Whether its disk bills after its end (see DISK_KEPT)."""
        return self.end_reason == EndReason.PREEMPTED and bool(self.stopped_disk_sku)


class InstanceEvent(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=12)
    to_state = models.CharField(max_length=12)
    message = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["created_at", "id"]


class InterruptionEvent(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="interruptions")
    kind = models.CharField(max_length=20, choices=InterruptionKind.CHOICES)
    source = models.CharField(max_length=30, choices=NOTICE_SOURCE_CHOICES)
    notice_time = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)
    checkpoint_saved = models.BooleanField(null=True, help_text="A checkpoint committed before the deadline.")
    steps_lost = models.PositiveBigIntegerField(null=True, blank=True)
    raw = models.TextField(blank=True)

    class Meta:
        ordering = ["received_at", "id"]


def default_checkpoint_tiers() -> list[str]:
    return [CheckpointTier.STORAGE]


class Checkpoint(models.Model):
    checkpoint_id = models.UUIDField(unique=True, help_text="Made by the agent, so a resend is recognised.")
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="checkpoints")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="checkpoints")
    step = models.PositiveBigIntegerField()
    uri = models.CharField(max_length=500)
    bytes = models.PositiveBigIntegerField()
    manifest_digest = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=CHECKPOINT_KIND_CHOICES, default=CheckpointKind.PERIODIC)
    committed_at = models.DateTimeField()
    save_s = models.FloatField(null=True, blank=True)
    stall_s = models.FloatField(null=True, blank=True)
    reference_loss = models.FloatField(null=True, blank=True)
    # What a notice save of this state would take against what the saving VM's cloud
    # gives: the job page warns before a notice when the one exceeds the other's budget.
    persist_s = models.FloatField(null=True, blank=True, help_text="save_s less its pacing")
    notice_window_s = models.FloatField(null=True, blank=True, help_text="the notice the saving VM's cloud gives; null: unknown")
    tiers = models.JSONField(default=default_checkpoint_tiers,
                             help_text="where the step was held as it committed (its manifest's record): storage, and "
                                       "the memory tier when every rank's replica of it was whole in the gang's stores")
    validation = models.CharField(max_length=10, choices=VALIDATION_CHOICES, default=ValidationResult.PENDING)
    validation_loss = models.FloatField(null=True, blank=True)
    validation_message = models.CharField(max_length=500, blank=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "step", "committed_at"]
        indexes = [models.Index(fields=["job", "-step"], name="checkpoint_job_step_idx")]

    def __str__(self):
        return f"checkpoint {self.checkpoint_id} step {self.step}"


class AuditEvent(models.Model):
    """Who did what to which object, and when. Rows are only ever added.

    `team` is empty for a person's own affairs (their API tokens); the actor's
    username is copied so the record outlives the account."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    actor_username = models.CharField(max_length=150)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events")
    action = models.CharField(max_length=30, choices=AuditAction.CHOICES)
    target = models.CharField(max_length=200, help_text="'kind:id' of what was acted on, e.g. 'job:12', 'user:alice'.")
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["team", "-created_at"], name="audit_team_time_idx"),
            models.Index(fields=["actor", "-created_at"], name="audit_actor_time_idx"),
        ]

    def __str__(self):
        return f"{self.actor_username} {self.action} {self.target}"
