"""What a checkpointer is told (CheckpointConfig) and what a save says (SaveOutcome),
shared by the manager, its policy and both writers (agents/respawn/checkpoint/manager.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from respawn import protocol
from respawn.envvars import env_float, env_int

from . import channel
from .errors import ConfigError
from .validation import ValidationSettings

DEFAULT_INTERVAL_S = 600.0


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and when to checkpoint. `CheckpointConfig.from_env()` fills the blanks
    from the agent's environment (agents/respawn/protocol.py)."""

    uri: str
    """Storage root of this job's checkpoints: a path, file://, s3://, gs:// or az://."""
    every_steps: int | None = None
    """Save every N steps. When set, it wins over `interval_s`."""
    interval_s: float | None = None
    """Save every T seconds (default 600); changeable at run time with `set_interval`."""
    keep: int = 2
    """Committed checkpoints to keep (>= 2), plus the newest valid one if it is older."""
    num_files: int = 4
    """Data files per rank, written in parallel."""
    pace_fraction: float = 0.5
    """A periodic persist is spread over this fraction of the interval."""
    notice_budget_s: float = 25.0
    """Time a notice save has when neither `save(deadline=)` nor the agent's notice file gives one."""
    agree_every_steps: int = 1
    """In a gang, ranks agree (stop, save now, save due, commit) every this many steps,
    without blocking a step (agents/respawn/checkpoint/distributed.py); a stop seen by one rank
    reaches all within 2 x this - 1 steps. Raise it when steps are short and ranks drift."""
    validation: ValidationSettings | None = None
    """Model and batch factories: reference loss at save, validation on resume."""
    validate_on_resume: bool = True
    resume_from: str | None = None
    """Resume from this checkpoint URI (or an older one if it is invalid) instead of the newest."""
    handle_signals: bool = True
    """SIGTERM -> notice save and stop at the next step; SIGUSR1 -> save at the next step."""
    overlap_snapshot: bool = True
    """Copy the weights and optimizer state of a periodic save beside the next step's
    forward/backward (the TrainState's optimizer waits for it before its next step).
    Turn off if the loop changes weights between a save and the optimizer's next step
    by other means than the optimizer: then CUDA tensors' copies are waited for by the
    training stream's next kernel instead of the optimizer's update."""
    write_live_fraction: float | None = None
    """With `overlap_snapshot`: up to this share of the state, taken from the optimizer's
    moments (never the weights, which the reference loss reads later), is written
    straight from the training state during the next step's forward/backward instead
    of being copied, so a save's extra host memory is about (1 - this) x the state.
    That step's `optimizer.step()` waits for those writes, so the default depends on
    the storage: 0.5 on a local disk (direct I/O takes them at memory speed), 0 (copy
    everything) on an object store, where they would wait for the upload."""
    memory_tier_addr: str | None = None
    """This node's buddy store ("host:port", which the agent runs): with every rank's, the
    packed Checkpointer replicates each rank's snapshot to the next rank's node
    (docs/memory-tier.md). None on any rank: no memory tier."""
    memory_tier_token: str = ""
    """That store's token; the ranks exchange it with the address, on their own group."""
    replica_every_steps: int | None = None
    """Replicate every this many steps; None: K chosen from the measured cost (tiers/pacing.py)."""
    checkpoints_file: str | None = None
    validations_file: str | None = None
    control_file: str | None = None
    notice_file: str | None = None

    def __post_init__(self):
        if not self.uri:
            raise ConfigError(f"CheckpointConfig.uri is empty: pass a storage URI or set {protocol.ENV_CHECKPOINT_URI}")
        if self.keep < 2:
            raise ConfigError(f"keep={self.keep}: keep at least 2 checkpoints, the newest may still be pending or being written")
        if self.every_steps is not None and self.every_steps < 1:
            raise ConfigError(f"every_steps={self.every_steps} must be >= 1 (or None to save by time)")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ConfigError(f"interval_s={self.interval_s} must be > 0 seconds")
        if self.num_files < 1:
            raise ConfigError(f"num_files={self.num_files} must be >= 1")
        if not 0 < self.pace_fraction <= 1:
            raise ConfigError(f"pace_fraction={self.pace_fraction} must be in (0, 1]")
        if self.write_live_fraction is not None and not 0 <= self.write_live_fraction <= 1:
            raise ConfigError(f"write_live_fraction={self.write_live_fraction} must be in [0, 1]")
        if self.agree_every_steps < 1:
            raise ConfigError(f"agree_every_steps={self.agree_every_steps} must be >= 1")
        if self.replica_every_steps is not None and self.replica_every_steps < 1:
            raise ConfigError(f"replica_every_steps={self.replica_every_steps} must be >= 1 (or None: chosen from the cost)")
        if self.notice_budget_s <= 0:
            raise ConfigError(f"notice_budget_s={self.notice_budget_s} must be > 0")

    @classmethod
    def from_env(cls, **overrides) -> "CheckpointConfig":
        env = os.environ
        values = {
            "uri": env.get(protocol.ENV_CHECKPOINT_URI, ""),
            "interval_s": env_float(protocol.ENV_CHECKPOINT_INTERVAL_S),
            "resume_from": env.get(protocol.ENV_RESUME_FROM) or None,
            "checkpoints_file": env.get(protocol.ENV_CHECKPOINTS_FILE) or None,
            "validations_file": env.get(protocol.ENV_VALIDATIONS_FILE) or None,
            "control_file": env.get(protocol.ENV_CONTROL_FILE) or None,
            "notice_file": env.get(protocol.ENV_NOTICE_FILE) or None,
            "memory_tier_addr": env.get(protocol.ENV_MEMORY_TIER_ADDR) or None,
            "memory_tier_token": env.get(protocol.ENV_MEMORY_TIER_TOKEN, ""),
            "replica_every_steps": env_int(protocol.ENV_REPLICA_EVERY_STEPS),
        }
        model_factory = env.get(protocol.ENV_VALIDATION_MODEL_FACTORY)
        batch_factory = env.get(protocol.ENV_VALIDATION_BATCH_FACTORY)
        if model_factory and batch_factory:
            values["validation"] = ValidationSettings(model_factory, batch_factory,
                                                      eval_fn=env.get(protocol.ENV_VALIDATION_EVAL_FN, ""))
        values.update(overrides)
        return cls(**values)


@dataclass
class SaveOutcome:
    step: int
    kind: str
    committed: bool | None  # None while a periodic persist is still in flight
    uri: str
    message: str = ""
    stall_s: float = 0.0
    save_s: float | None = None
    checkpoint_id: str = ""


def notice_deadline(config: CheckpointConfig) -> float:
    """A notice save's deadline as monotonic time: the agent's notice file's (the cloud's
    less the agent's margin: 108 s of AWS's two minutes), else `notice_budget_s` from now."""
    remaining = channel.notice_deadline(config.notice_file)
    return time.monotonic() + (config.notice_budget_s if remaining is None else remaining)

