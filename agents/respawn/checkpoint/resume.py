"""Which checkpoint a run resumes from, and what `load_latest()` tells the loop about it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from .errors import CorruptCheckpointError, EvalError
from .reader import CheckpointRef, LoadedCheckpoint, list_checkpoints, load, other_framework, ref_from_uri
from .storage import Storage
from .validation import ValidationSettings, Verdict, judge, mark


@dataclass(frozen=True, slots=True)
class Skipped:
    """A checkpoint newer than the one resumed from, and why it was not used."""

    step: int
    uri: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """What `Checkpointer.load_latest()` restored: the loop continues at `step`
    (0 and `uri` None when there was nothing to resume from, or `tier` "memory"). `skipped` holds the
    newer checkpoints passed over, newest first, each with its reason."""

    step: int
    uri: str | None
    skipped: tuple[Skipped, ...] = ()
    tier: str = "storage"
    """"memory": restored from the gang's buddy stores (docs/memory-tier.md); `uri` None,
    or the checkpoint in storage holding the same step, read from memory instead."""

    def __str__(self) -> str:
        if self.tier == "memory":
            head = f"resumed at step {self.step} from the memory tier" + (f" (the step of {self.uri})" if self.uri else "")
        else:
            head = f"resumed at step {self.step} from {self.uri}" if self.uri else "no checkpoint to resume from: starting at step 0"
        return "; ".join([head, *(f"skipped {s.uri}: {s.reason}" for s in self.skipped)])


def choose(storage: Storage, resume_from: str | None, validation: ValidationSettings | None,
           record: Callable[[LoadedCheckpoint, Verdict], None], framework: str = "torch",
           loader: Callable[[CheckpointRef], LoadedCheckpoint] = load) -> tuple[LoadedCheckpoint | None, tuple[Skipped, ...]]:
    """The newest usable checkpoint (not after `resume_from`), loaded and verified, and
    validated first with `validation` unless a verdict is recorded (an invalid one is
    marked and the previous one tried); and the newer ones skipped on the way. A verdict
    reached here goes to `record`, which marks it beside the checkpoint. One written by
    another `framework` raises IncompatibleCheckpointError: falling back past it would
    silently train from older state, and deleting it would lose the other run's work.
    `loader` reads and verifies one (a framework's own files: agents/respawn/integrations)."""
    limit = ref_from_uri(resume_from).step if resume_from else None
    skipped: list[Skipped] = []
    for ref in reversed(list_checkpoints(storage)):
        if limit is not None and ref.step > limit:
            loaded, reason = None, f"newer than resume_from {resume_from}"
        else:
            loaded, reason = _load_usable(ref, validation, record, framework, loader)
        if loaded is not None:
            return loaded, tuple(skipped)
        skipped.append(Skipped(ref.step, ref.uri, reason))
        print(f"respawn checkpoint: skipping {ref.uri}: {reason}", file=sys.stderr)
    return None, tuple(skipped)


def _load_usable(ref: CheckpointRef, validation: ValidationSettings | None,
                 record: Callable[[LoadedCheckpoint, Verdict], None], framework: str,
                 loader: Callable[[CheckpointRef], LoadedCheckpoint]) -> tuple[LoadedCheckpoint | None, str]:
    """The checkpoint loaded, or None and why it cannot be used."""
    if not ref.is_committed():
        return None, "not committed (no MANIFEST.json): its save was cut short or is still running"
    verdict = ref.validation()
    if verdict and verdict.get("result") == "invalid":
        return None, f"recorded invalid: {verdict.get('message') or 'no reason given'}"
    # A recorded `error` is checked again: the eval_fn may be fixed, and a check that cannot
    # run says nothing about the checkpoint, so it stops the resume (naming why) rather than
    # falling back to older ones it would fail on alike.
    check = validation is not None and (not verdict or verdict.get("result") == "error")
    try:
        loaded = loader(ref)
        if loaded.meta.get("framework", "torch") != framework:  # checkpoints before DESIGN §11 are the torch loop's
            raise other_framework(ref.uri, loaded.meta.get("framework", "torch"), framework)
        verdict_now = judge(loaded, validation) if check else None  # its saved meta may prove malformed here
    except CorruptCheckpointError as exc:
        mark(ref, Verdict(False, None, None, str(exc)))
        return None, f"corrupt: {exc}"
    if verdict_now is not None:
        record(loaded, verdict_now)
        if verdict_now.error:
            raise EvalError(f"cannot validate {ref.uri} to resume from it: {verdict_now.message}")
        if not verdict_now.valid:
            return None, f"failed validation: {verdict_now.message}"
    return loaded, ""
