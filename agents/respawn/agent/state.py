"""What the agent knows and has decided on its VM: the one mutable object its modules
(registration, setup, gang, notice handling, heartbeat answers, shipping, ending) read
and change; everything else the agent holds (config, paths, client, journal) is set once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from respawn import protocol
from respawn.agent.channel import LogTail
from respawn.agent.session import Session
from respawn.agent.supervisor import TrainerProcess
from respawn.agent.validation import Validator
from respawn.checkpoint.tiers import BuddyServer
from respawn.notices import NoticeEvent


@dataclass
class AgentState:
    logs: LogTail | None = None  # made once it is known whether this run resumes a session
    session: Session | None = None
    job: protocol.JobSpec | None = None
    trainer: TrainerProcess | None = None  # the process being supervised: the prepare step, then the trainer
    preparing: bool = False
    validator: Validator | None = None
    notice: NoticeEvent | None = None
    notice_commit: protocol.CheckpointReport | None = None
    last_checkpoint: protocol.CheckpointReport | None = None
    checkpoint_requested: bool = False  # SIGUSR1 sent, no commit seen since
    save_too_slow: bool = False  # the last periodic save would not fit this cloud's notice
    commit_journaled_at: datetime | None = None
    stopped_by_control_plane: bool = False
    kill_at: float | None = None  # monotonic time the trainer is killed if still alive
    kill_why: str = ""  # said in the job's output when it is
    hold_until: float | None = None  # monotonic time a notice's save starts at the latest, while held
    hold_limit: float | None = None  # hold_until once the control plane confirmed a spare is launching
    rebalance_reported: bool = False  # a job with spare_on_rebalance reports the first one only
    heartbeat_interval_s: float = 10.0
    checkpoint_interval_s: float | None = None
    # An elastic gang (JobSpec.elastic): the exit code of a trainer that exited on its own while
    # this node waits for the gang's word, and whether a new form of the gang was announced.
    trainer_exit_code: int | None = None
    regroup_wanted: bool = False
    buddy_store: BuddyServer | None = None  # a multi-node job's memory tier (agent/memory_tier.py)
    handover: dict | None = None  # the spare's store this VM's notice save goes to (HeartbeatAnswer.handover)
