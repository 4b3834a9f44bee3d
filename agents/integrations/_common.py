"""What every framework integration shares: pick the checkpoint to resume from (as
`Checkpointer.load_latest()` does, the framework named) and stop the way the agent
expects after a notice."""

from __future__ import annotations

import functools
import sys

from agents import trainer
from agents.checkpoint.checkpointer import CheckpointConfig, record_verdict
from agents.checkpoint.reader import LoadedCheckpoint
from agents.checkpoint.resume import Resumed, choose
from agents.checkpoint.rotation import remove_torn
from agents.checkpoint.storage import open_storage


def choose_checkpoint(config: CheckpointConfig, framework: str) -> LoadedCheckpoint | None:
    """The newest committed checkpoint of `framework` that passes validation (when
    configured), loaded and verified; None when there is none. Torn directories go
    first, as on any resume; a checkpoint of another framework raises."""
    storage = open_storage(config.uri)
    remove_torn(storage)
    validation = config.validation if config.validate_on_resume else None
    chosen, skipped = choose(storage, config.resume_from, validation,
                             functools.partial(record_verdict, config.validations_file), framework)
    resumed = Resumed(chosen.ref.step, chosen.ref.uri, skipped) if chosen else Resumed(0, None, skipped)
    print(f"respawn {framework}: {resumed}", file=sys.stderr, flush=True)
    return chosen


def report_stop(step: int) -> None:
    """Tell the agent that the trainer's coming exit 0 is a stop on request, not the end
    of training (agents/agent/lifecycle.py reads `stopped` from the status file)."""
    trainer.report(step, force=True, stopped=True)
    print(f"respawn: stopped at step {step} after a notice save; exiting so the job resumes elsewhere",
          file=sys.stderr, flush=True)
