"""Accelerate's `save_state` / `load_state`, committed under Respawn's protocol.

    from agents.integrations.accelerate import SpotSafeState
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    spot = SpotSafeState(accelerator)                 # CheckpointConfig.from_env() by default
    start = spot.resume()                             # newest committed checkpoint loaded: its step, else 0
    for step, batch in enumerate(accelerator.skip_first_batches(loader, start), start):
        ...forward, backward, optimizer.step(), scheduler.step()...
        if spot.step(step + 1):                       # saves when due or on a notice; True: stop now
            break

Each save is Accelerate's own `save_state` into a staging folder (what it restores,
`load_state` restores: models, optimizers, schedulers, scalers, its RNG states,
registered objects), then its files are written to the checkpoint root as
`step-N/` with state.json (framework `accelerate`) and MANIFEST.json last, LATEST,
rotation and a report to the agent (DESIGN §6). `resume()` takes the newest committed
one, verifies every file's digest and hands a local copy to `load_state`; a torn
directory (no manifest) is never picked. A SIGTERM makes the next `step()` save and
return True; report and exit are then the script's (return from main, exit 0).

Not here: the two-phase save of `Checkpointer` (Accelerate's save is synchronous, so
a periodic save stalls training for as long as `save_state` takes), validation of
these checkpoints (their verdict is `skipped`), and a notice deadline (the save is
made at full speed and committed whenever it ends).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone

from agents import protocol
from agents.checkpoint import channel, layout, manifest
from agents.checkpoint.checkpointer import DEFAULT_INTERVAL_S, CheckpointConfig
from agents.checkpoint.reader import committed, other_framework
from agents.checkpoint.rotation import remove_torn, rotate
from agents.checkpoint.storage import open_storage

from ._common import report_stop

FRAMEWORK = "accelerate"


class SpotSafeState:
    def __init__(self, accelerator, config: CheckpointConfig | None = None):
        self.accelerator = accelerator
        self.config = config or CheckpointConfig.from_env()
        self.storage = open_storage(self.config.uri)
        self.should_stop = False
        self._stop_seen = False
        self._last_step = 0
        self._committed_step = -1
        self._last_at = time.monotonic()
        if self.config.handle_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_stop)

    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True  # only a flag: the save happens at the next step()

    def resume(self) -> int:
        """Load the newest committed checkpoint into the accelerator; its step, else 0."""
        remove_torn(self.storage)
        refs = committed(self.storage)
        if not refs:
            print("respawn accelerate: no checkpoint to resume from: starting at step 0", file=sys.stderr, flush=True)
            return 0
        ref = refs[-1]
        man = manifest.verify_all(self.storage, ref.name)
        meta = json.loads(self.storage.read(ref.key(layout.STATE)))
        written_by = meta.get("framework", "torch")
        if written_by != FRAMEWORK:
            raise other_framework(ref.uri, written_by, FRAMEWORK)
        staging = tempfile.mkdtemp(prefix=f"respawn-accelerate-{ref.step}-")
        try:
            for name in meta["files"]:
                with open(os.path.join(staging, name), "wb") as f:
                    f.write(manifest.read_verified(self.storage, ref.name, name, man.files[name]))
            self.accelerator.load_state(staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._last_step, self._committed_step, self._last_at = ref.step, ref.step, time.monotonic()
        print(f"respawn accelerate: resumed at step {ref.step} from {ref.uri}", file=sys.stderr, flush=True)
        return ref.step

    def step(self, step: int) -> bool:
        """Call after every optimizer step: saves when due (every_steps / interval_s)
        or after a notice; True once a notice save was made and training must stop."""
        if self._stop_seen and not self.should_stop:
            self.should_stop = True
            self.save(step, protocol.CheckpointKind.NOTICE)
            report_stop(step)
        elif self._due(step):
            self.save(step, protocol.CheckpointKind.PERIODIC)
        return self.should_stop

    def _due(self, step: int) -> bool:
        if step == self._last_step:
            return False
        if self.config.every_steps:
            return step - self._last_step >= self.config.every_steps
        return time.monotonic() - self._last_at >= (self.config.interval_s or DEFAULT_INTERVAL_S)

    def save(self, step: int, kind: str = protocol.CheckpointKind.PERIODIC) -> str:
        """Accelerate's save_state, committed as step-N; returns its URI."""
        if step == self._committed_step:  # a final save right after the periodic one of the same step
            return self.storage.url_for(layout.step_dir(step))
        started = time.monotonic()
        self._last_step, self._last_at = step, started
        staging = tempfile.mkdtemp(prefix="respawn-accelerate-save-")
        try:
            self.accelerator.save_state(staging)
            self.accelerator.wait_for_everyone()
            uri = self._commit(step, kind, staging, started) if self.accelerator.is_main_process else ""
            self._committed_step = step
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"respawn accelerate: {kind} save of step {step}: committed {uri}", file=sys.stderr, flush=True)
        return uri

    def _commit(self, step: int, kind: str, staging: str, started: float) -> str:
        ckpt = layout.step_dir(step)
        for name in (layout.MANIFEST, layout.VALIDATION, layout.STATE):  # an earlier attempt's commit record
            self.storage.delete_prefix(f"{ckpt}/{name}")
        files: dict[str, manifest.FileEntry] = {}
        for name in sorted(os.listdir(staging)):
            with open(os.path.join(staging, name), "rb") as f:
                data = f.read()
            self.storage.write_atomic(f"{ckpt}/{name}", data)
            files[name] = manifest.FileEntry(len(data), manifest.digest_bytes(data))
        checkpoint_id = str(uuid.uuid4())
        created = datetime.now(timezone.utc).isoformat()
        state = json.dumps({"format": layout.FORMAT, "framework": FRAMEWORK, "step": step, "kind": kind,
                            "world_size": self.accelerator.num_processes, "created_at": created,
                            "checkpoint_id": checkpoint_id, "files": sorted(files)}).encode()
        self.storage.write_atomic(f"{ckpt}/{layout.STATE}", state)
        files[layout.STATE] = manifest.FileEntry(len(state), manifest.digest_bytes(state))
        raw = manifest.encode(step, files, created)
        self.storage.write_atomic(f"{ckpt}/{layout.MANIFEST}", raw)
        self.storage.write_atomic(layout.LATEST, ckpt.encode())
        man = manifest.Manifest(step, files, raw)
        uri = self.storage.url_for(ckpt)
        save_s = time.monotonic() - started
        channel.append_checkpoint_report(self.config.checkpoints_file, protocol.CheckpointReport(
            checkpoint_id=checkpoint_id, step=step, uri=uri, bytes=man.total_bytes, manifest_digest=man.digest,
            kind=kind, committed_at=created, save_s=save_s, stall_s=save_s, persist_s=save_s))
        rotate(self.storage, self.config.keep)
        return uri
