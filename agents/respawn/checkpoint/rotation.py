"""Which checkpoint directories go: the old ones after each commit, and torn ones.

A directory is torn when it has no MANIFEST.json and no writer will ever finish
it: a process killed mid-persist left it (data files still temporary, or some
renamed into place), or rotation was killed between deleting a manifest and the
rest of its directory. Either can hold a whole checkpoint's bytes.

A directory without a manifest may also be a live writer's. Only a save of a step
newer than the newest committed checkpoint can be: a gang's ranks all write the
step rank 0 commits next, and rank 0 commits it only once every rank has written
its files, so once step S is committed no rank is still writing a step below S.
This process's own persist is never below it either: sweeps run on start, before
any save, and right after this process's own commit. So a directory without a
manifest older than the newest committed checkpoint is torn and goes; a newer one
stays until a commit passes it.
"""

from __future__ import annotations

from . import layout
from .reader import CheckpointRef, committed, list_checkpoints
from .storage import Storage


def being_validated(refs: list[CheckpointRef], verdicts: dict[str, dict | None]) -> CheckpointRef | None:
    """The checkpoint the agent's validator is reading: the newest one it claimed
    (VALIDATING.json, written as it starts) that has no verdict yet, none newer having
    one. Without it, a validator slower than `keep` commits (a VM whose CPUs the training
    keeps busy: it runs at the lowest priority) would find each checkpoint it starts on
    deleted before it reads it, and no checkpoint would ever be validated. A claim left
    by a validator that died holds one checkpoint until a newer one gets a verdict."""
    for ref in reversed(refs):
        if verdicts[ref.name] is not None:
            return None
        if ref.storage.exists(ref.key(layout.VALIDATING)):
            return ref
    return None


def remove_torn(storage: Storage) -> list[str]:
    """Delete the torn directories (see above); returns their names."""
    refs = list_checkpoints(storage)
    committed = {ref.name for ref in refs if ref.is_committed()}
    if not committed:
        return []
    newest = max(layout.parse_step_dir(name) for name in committed)
    torn = [ref.name for ref in refs if ref.step < newest and ref.name not in committed]
    for name in torn:
        storage.delete_prefix(name)
    return torn


def rotate(storage: Storage, keep: int) -> None:
    """Keep the `keep` newest committed checkpoints that are not invalid, plus the
    newest valid one when it is older than those (its successors are still pending),
    plus the one a validator is reading (see `being_validated`).
    Every other committed one older than the newest kept goes, manifest first, so a
    crash in the middle leaves a torn directory (removed by the next sweep), never a
    committed one missing files. Then the torn directories go."""
    refs = committed(storage)
    verdicts = {r.name: r.validation() for r in refs}
    usable = [r for r in refs if (verdicts[r.name] or {}).get("result") != "invalid"]
    if usable:
        kept = {r.name for r in usable[-keep:]}
        valid = [r for r in usable if (verdicts[r.name] or {}).get("result") == "valid"]
        if valid:
            kept.add(valid[-1].name)
        reading = being_validated(usable, verdicts)
        if reading is not None:
            kept.add(reading.name)
        newest = usable[-1].step
        for ref in refs:
            if ref.name in kept or ref.step >= newest:
                continue
            storage.delete_prefix(ref.key(layout.MANIFEST))
            storage.delete_prefix(ref.name)
    remove_torn(storage)
