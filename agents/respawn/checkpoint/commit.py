"""The one commit sequence of every writer (DESIGN §6): stage the step's directory, the
writer writes its data files (digested as written), then rank 0 commits them: state.json,
MANIFEST.json (durable: the checkpoint exists from here), LATEST; reports the checkpoint
to the agent, rotates. A save that did not commit leaves the previous checkpoint standing,
and says so."""

from __future__ import annotations

import sys
import time
import uuid

from respawn import protocol

from . import channel, layout, manifest
from .config import CheckpointConfig, SaveOutcome
from .persist import Pace
from .reader import committed
from .rotation import rotate
from .storage import Storage

# What a directory of this step from an abandoned attempt may hold besides data files:
# its commit record (the manifest first), a verdict and a validator's claim.
_RECORD = (layout.MANIFEST, layout.VALIDATION, layout.VALIDATING, layout.STATE)


def stage(storage: Storage, ckpt: str, *, whole: bool) -> None:
    """Rank 0, before any rank writes into `ckpt`: an abandoned attempt's commit record goes,
    or with `whole` everything (a writer whose file names depend on the world size)."""
    if whole:
        storage.delete_prefix(ckpt)
        return
    for name in _RECORD:
        storage.delete_prefix(f"{ckpt}/{name}")


def commit(storage: Storage, config: CheckpointConfig, ckpt: str, files: dict[str, manifest.FileEntry], meta: dict,
           outcome: SaveOutcome, started: float, *, stall_s: float | None = None, pace: Pace | None = None,
           tiers: tuple[str, ...] = (protocol.CheckpointTier.STORAGE,)) -> None:
    """Rank 0, once every rank's `files` are durable: commit `ckpt`, report it, rotate.
    `stall_s`: what the save cost the loop (None: all of it, training waited); `pace`: a
    paced persist's, so the report says what it would take unpaced; `tiers`: where the
    step is held as it commits, as its manifest and report record."""
    # Every rank's writers of this step are closed by now: an unfinished write left
    # here is an earlier, killed attempt's, and would outlive this commit.
    storage.discard_unfinished(ckpt)
    # The checkpoint names its own report id, so a verdict reached on it later (on
    # resume, before export) reaches the control plane's record of it.
    meta["checkpoint_id"] = outcome.checkpoint_id = str(uuid.uuid4())
    man, created = manifest.commit(storage, ckpt, outcome.step, files, meta, tiers)
    storage.discard_unfinished(layout.LATEST)  # a killed earlier commit's, if any
    outcome.committed = True
    outcome.save_s = time.monotonic() - started
    channel.append_checkpoint_report(config.checkpoints_file, protocol.CheckpointReport(
        checkpoint_id=outcome.checkpoint_id, step=outcome.step, uri=outcome.uri, bytes=man.total_bytes,
        manifest_digest=man.digest, kind=outcome.kind, committed_at=created, save_s=outcome.save_s,
        stall_s=outcome.save_s if stall_s is None else stall_s, reference_loss=meta.get("reference_loss"),
        persist_s=outcome.save_s if pace is None else pace.unpaced_s(outcome.save_s), tiers=list(man.tiers)))
    rotate(storage, config.keep)


def not_committed(storage: Storage, outcome: SaveOutcome, reason: str) -> None:
    """The outcome of a save that did not commit: why, and that the previous checkpoint stands."""
    previous = [r.name for r in committed(storage)]
    outcome.committed = False
    outcome.message = f"{reason}; previous checkpoint {previous[-1] if previous else '(none)'} is intact"


def announce(outcome: SaveOutcome) -> SaveOutcome:
    """A save made before `save()` returned, on the trainer's stderr (the agent's log)."""
    print(f"respawn checkpoint: {outcome.kind} save of step {outcome.step}: "
          f"{'committed ' + outcome.uri if outcome.committed else outcome.message}", file=sys.stderr, flush=True)
    return outcome
