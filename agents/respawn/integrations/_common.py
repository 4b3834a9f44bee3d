"""What every framework integration shares: the framework versions it supports, pick
the checkpoint to resume from (as `Checkpointer.load_latest()` does, the framework
named) and stop the way the agent expects after a notice."""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
from collections.abc import Callable

from respawn import trainer
from respawn.checkpoint.checkpointer import CheckpointConfig, SaveOutcome, record_verdict
from respawn.checkpoint.errors import ConfigError, NoticeSaveMissed
from respawn.checkpoint.reader import CheckpointRef, LoadedCheckpoint, load
from respawn.checkpoint.resume import Resumed, choose
from respawn.checkpoint.rotation import remove_torn
from respawn.checkpoint.storage import open_storage


# The releases each integration is built and tested against: the bounds of the library's
# extras (agents/pyproject.toml; tests/integrations/test_versions.py holds them equal).
# Another release may save or restore differently (a Trainer's resume, Orbax's args API), so it is refused by name
# rather than trusted to checkpoint correctly.
SUPPORTED = {
    "transformers": ("5.0", "6", "hf"),
    "accelerate": ("1.0", "2", "accelerate"),
    "lightning": ("2.4", "3", "lightning"),
    "orbax-checkpoint": ("0.12", "0.13", "jax"),
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", re.match(r"[\d.]*", version).group())[:3])


def require_supported(distribution: str) -> str:
    """The installed version of `distribution`; ConfigError naming it and the supported
    range when it is outside that range."""
    at_least, below, extra = SUPPORTED[distribution]
    installed = importlib.metadata.version(distribution)
    if not _release(at_least) <= _release(installed) < _release(below):
        raise ConfigError(f"{distribution} {installed} is not supported by respawn.integrations (it is built and "
                          f"tested for {distribution}>={at_least},<{below}): install a supported release, e.g. "
                          f"pip install 'respawn-ml[{extra}]'")
    return installed


def choose_checkpoint(config: CheckpointConfig, framework: str,
                      loader: Callable[[CheckpointRef], LoadedCheckpoint] = load) -> LoadedCheckpoint | None:
    """The newest committed checkpoint of `framework` that passes validation (when
    configured), loaded and verified by `loader`; None when there is none. Torn
    directories go first, as on any resume; a checkpoint of another framework raises."""
    storage = open_storage(config.uri)
    remove_torn(storage)
    validation = config.validation if config.validate_on_resume else None
    chosen, skipped = choose(storage, config.resume_from, validation,
                             functools.partial(record_verdict, config.validations_file), framework, loader)
    resumed = Resumed(chosen.ref.step, chosen.ref.uri, skipped) if chosen else Resumed(0, None, skipped)
    print(f"respawn {framework}: {resumed}", file=sys.stderr, flush=True)
    return chosen


def report_stop(outcome: SaveOutcome | None) -> None:
    """After a stop's save: tell the agent that the trainer's coming exit 0 is a stop on
    request, not the end of training (agents/respawn/agent/lifecycle.py reads `stopped` from the
    status file). Only a committed save is a stop: without one (`outcome` None: nothing
    could be saved) NoticeSaveMissed says why, and the process exits non-zero."""
    if outcome is None or not outcome.committed:
        raise NoticeSaveMissed(outcome.message if outcome is not None else "no notice save could be made at this point")
    trainer.report(outcome.step, force=True, stopped=True)
    print(f"respawn: stopped at step {outcome.step} after a notice save; exiting so the job resumes elsewhere",
          file=sys.stderr, flush=True)
