"""The Checkpointer: the checkpoint manager (agents/respawn/checkpoint/manager.py) of a
PyTorch loop, with the packed writer (agents/respawn/checkpoint/packed.py) as its backend.
The training loop calls it every step; the save policy (policy.py) decides when to save,
the packed writer snapshots, persists in the background and commits (commit.py). Why a
save is made the way it is: packed.py. Signal handlers only set flags; the work happens
in the next `save()` call.
"""

from __future__ import annotations

import sys

from respawn import protocol, trainer

from . import channel, layout
from .config import DEFAULT_INTERVAL_S, CheckpointConfig, SaveOutcome, notice_deadline  # noqa: F401 (their public home)
from .distributed import Coordinator
from .errors import CheckpointError, IncompatibleCheckpointError
from .manager import CheckpointManager
from .packed import PackedWriter
from .reader import CheckpointRef, LoadedCheckpoint, committed, load
from .resume import Resumed, choose
from .rotation import remove_torn
from .state import TrainState
from .storage import Storage, open_storage
from .tiers import restore
from .tiers.client import ReplicaUnavailable, fetch, status
from .tiers.replicator import gang_ring, replicator
from .validation import Verdict, judge, judge_weights, mark

FRAMEWORK = "torch"


class Checkpointer(CheckpointManager):
    """Call `load_latest()` once, `save(step)` after every step, `close()` at the end.

        ckpt = Checkpointer(TrainState(model, optimizer, scheduler, sampler=sampler), config)
        for step in range(ckpt.load_latest().step, total_steps):
            train_one_step()
            ckpt.save(step + 1)
            if ckpt.should_stop:
                break
        else:
            ckpt.finish(total_steps)  # final save, validation, export
        ckpt.close()

    `step` counts completed steps: resuming from a checkpoint saved with
    `save(1200)` gives `load_latest().step == 1200` and the loop runs step 1200 next.
    """

    def __init__(self, state: TrainState, config: CheckpointConfig, framework: str = FRAMEWORK, *,
                 hook_optimizer: bool = True):
        super().__init__(config, Coordinator(config.agree_every_steps))
        self.state = state
        self.framework = framework  # in state.json: a resume by another framework refuses it (DESIGN §11)
        self.storage: Storage = open_storage(config.uri)
        self.rank = self.coord.rank
        self._ring = gang_ring(self.coord, config)
        replicas = replicator(self.coord, config, self._ring)
        self._start(PackedWriter(state, config, framework, self.storage, self.coord, self.clock, hook_optimizer, replicas))

    def before_optimizer_step(self) -> None:
        """With `hook_optimizer=False`: call it after forward/backward, right before the
        optimizer changes the weights (Lightning runs forward/backward inside
        `optimizer.step(closure)`, where a step pre-hook would wait before them)."""
        self.backend.before_optimizer_step()

    @property
    def host_buffer_bytes(self) -> int:
        """Host memory the snapshot buffers hold (allocated at the first save, then
        reused): the state's size less what is written live."""
        return self.backend.buffers.nbytes

    @property
    def _inflight(self):
        """The persist in flight (tests/gpu read its device copies)."""
        return self.backend.inflight

    def wait(self) -> SaveOutcome | None:
        """Finish the in-flight persist (if any) at full speed (the caller blocks anyway)
        and return its outcome; raise if it failed. In a gang every rank must call it
        together (it settles the commit)."""
        return self.backend.drain() or self.last_outcome

    def finish(self, step: int):
        """End of training: final save, validation, export of the weights (safetensors).
        Returns the exported Artifact, or None without validation settings (nothing
        can be exported unvalidated). Rank 0 exports; other ranks return None."""
        outcome = self.save(step, kind=protocol.CheckpointKind.FINAL)
        self.close()
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        if self.rank != 0 or self.config.validation is None:
            return None
        return export_final(load(CheckpointRef(self.storage, layout.step_dir(step))), self.config)

    def _record_verdict(self, loaded: LoadedCheckpoint, verdict: Verdict) -> None:
        record_verdict(self.config.validations_file, loaded, verdict)

    # --- resuming ------------------------------------------------------------------------
    def load_latest(self) -> Resumed:
        """Restore the newest usable checkpoint into the TrainState and say which:
        `load_latest().step` is where the loop continues (0 when there is none), and
        `.skipped` the newer checkpoints passed over, with why. Rank 0 picks it
        (validating it first when validation is configured: an invalid one is marked
        and the previous one tried) and every rank loads the same one. Torn
        directories older than the newest committed checkpoint are deleted first.

        With the memory tier, a step newer than storage's newest that every rank finds in a
        store of the gang, verified, is resumed from instead (tiers/restore.py), and
        `.tier` says "memory"; so is storage's newest step itself when the stores hold it
        whole (`.uri` then names its checkpoint in storage): memory is the faster tier."""
        resumed = self._load_from_memory() if self._ring is not None else None
        if resumed is not None:
            return resumed
        chosen, skipped = None, ()
        if self.rank == 0:
            remove_torn(self.storage)
            validation = self.config.validation if self.config.validate_on_resume else None
            chosen, skipped = choose(self.storage, self.config.resume_from, validation, self._record_verdict, self.framework)
        name, skipped = self.coord.broadcast_from_zero((chosen.ref.name if chosen else None, skipped))
        if name is None:
            return Resumed(0, None, skipped)
        loaded = chosen if self.rank == 0 else load(CheckpointRef(self.storage, name), self.rank)
        try:
            self.state.load_state_dict(loaded.state)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise IncompatibleCheckpointError(f"checkpoint {loaded.ref.uri} does not fit this training state: {exc}") from None
        self.resumed_at(loaded.ref.step)
        return Resumed(loaded.ref.step, loaded.ref.uri, skipped)

    def _load_from_memory(self) -> Resumed | None:
        """The memory tier's step, loaded on every rank, or None on every rank (storage then):
        a step newer than storage's newest, or storage's newest itself, read from the stores
        rather than storage (the faster tier) unless a validator recorded it invalid there."""
        found = None
        if self.rank == 0:
            refs = committed(self.storage)
            newest = refs[-1] if refs else None
            floor = 0
            if newest is not None:
                condemned = (newest.validation() or {}).get("result") == "invalid"
                floor = newest.step if condemned else newest.step - 1
            planned = restore.plan([self._holdings(store) for store in self._ring.stores], self.coord.world_size, floor,
                                   self._ring.ranks_per_node)
            if planned is not None:
                found = (*planned, newest.uri if newest is not None and planned[0] == newest.step else None)
        found = self.coord.broadcast_from_zero(found)
        if found is None:
            return None
        step, gang, nodes, in_storage = found
        store = self._ring.stores[nodes[self.rank]]
        try:
            shard = fetch(*store, self.rank, step=step)
            if (shard.step, shard.gang) != (step, gang):
                raise ReplicaUnavailable(f"its store now holds step {shard.step} of another run, not {step}")
            state, meta = restore.state_of(shard)
            self.state.load_state_dict(state)
            ok = self.rank != 0 or self._replica_holds_up(step, state, meta)
        except (ReplicaUnavailable, CheckpointError, RuntimeError, KeyError, ValueError) as exc:
            print(f"respawn checkpoint: rank {self.rank} cannot resume step {step} from the memory tier: {exc}",
                  file=sys.stderr, flush=True)
            ok = False
        if not all(row[0] for row in self.coord.exchange([int(ok)])):
            print(f"respawn checkpoint: step {step} is not whole and valid in the memory tier: resuming from storage", file=sys.stderr)
            return None
        where = f"{store[0][0]}:{store[0][1]}"
        if in_storage is not None:
            self.resumed_at(step)  # committed: a notice here saves nothing new, the next save is an interval away
            print(f"respawn checkpoint: rank {self.rank} resumed at step {step} from the memory tier (its state from the "
                  f"store at {where}): the step of storage's newest checkpoint {in_storage}, read from memory instead",
                  file=sys.stderr, flush=True)
            return Resumed(step, in_storage, tier="memory")
        # Not `resumed_at`: this step is in no storage, so a notice here must save it, and the
        # first periodic save the gang can agree on from here persists its state (in the
        # background), not one an interval away: until then, two more nodes lost lose them.
        self.clock.overdue(step)
        if self.backend.replicas is not None:
            self.backend.replicas.started_step = step
        print(f"respawn checkpoint: rank {self.rank} resumed at step {step} from the memory tier (its state from the store "
              f"at {where}), newer than storage's newest checkpoint: its next save goes to storage",
              file=sys.stderr, flush=True)
        trainer.resumed_from_memory(step)  # the control plane learns the step the gang went on from
        return Resumed(step, None, tier="memory")

    def _replica_holds_up(self, step: int, state: dict, meta: dict) -> bool:
        """Rank 0's replica, intact by its digests, checked as a checkpoint is on resume: its
        weights must give the reference loss computed from them at the snapshot. A check
        that could not run condemns nothing, as on storage."""
        validation = self.config.validation if self.config.validate_on_resume else None
        if validation is None:
            return True
        verdict = judge_weights(f"the memory tier's step {step}", state["model"], meta, validation)
        said = f"loss {verdict.loss!r}, reference {verdict.reference_loss!r}" if verdict.loss is not None else verdict.message
        print(f"respawn checkpoint: step {step} from the memory tier: {verdict.result} ({said})", file=sys.stderr, flush=True)
        return verdict.valid or verdict.error

    @staticmethod
    def _holdings(store) -> list[list[int]]:
        try:
            return status(*store)["replicas"]
        except ReplicaUnavailable:
            return []  # its node is gone: what it held is

    def resumed_at(self, step: int) -> None:
        """The loop continues from committed checkpoint `step`, restored by `load_latest()`
        or by a framework's own resume from a copy of it (agents/respawn/integrations): the next
        periodic save is an interval from now, and a notice at this step saves nothing new."""
        super().resumed_at(step)
        self.backend.last_committed_step = step
        if self.backend.replicas is not None:
            self.backend.replicas.started_step = step  # K steps from here, as the periodic saves


def export_final(loaded: LoadedCheckpoint, config: CheckpointConfig):
    """The final checkpoint validated with `config.validation` (the verdict recorded and
    reported), then its weights exported as safetensors, which refuses all but `valid`;
    the exported Artifact. The agent ships it with its exit report (agents/respawn/protocol.py channel)."""
    from .export import export_weights

    record_verdict(config.validations_file, loaded, judge(loaded, config.validation))
    artifact = export_weights(loaded.ref, weights=loaded.state["model"])
    trainer.report(loaded.ref.step, force=True, artifact_uri=artifact.uri, artifact_digest=artifact.digest)
    return artifact


def record_verdict(validations_file: str | None, loaded: LoadedCheckpoint, verdict: Verdict) -> None:
    """Beside the checkpoint, and to the agent, which reports it: the checkpoint a
    run resumes from or exports was validated here, not by the agent's validator."""
    mark(loaded.ref, verdict)
    if loaded.meta.get("checkpoint_id"):
        channel.append_validation_report(validations_file, loaded.meta["checkpoint_id"],
                                         protocol.ValidationReport(**verdict.to_json()))
