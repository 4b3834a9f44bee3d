"""The on-node agent (`respawn-agent run`, DESIGN §5 and §7).

Modules: `config` (flags and environment), `client` (HTTP calls), `reporter`
(journaled, ordered delivery), `channel` (files shared with the trainer),
`supervisor` (the trainer process), `validation` (low-priority checkpoint
validation), `prepare` (the prepare step, cached by content hash), `lifecycle`
(the whole life), `preflight` (is a script spot-safe).

What the agent adds to the trainer channel of agents/protocol.py:
- work dir layout: `trainer.log` (the trainer's output, plus lines starting with
  `[respawn-agent]` saying what the agent did), `channel/` (status.json,
  checkpoints.jsonl, control.json, notice.json), `journal/` (offline journal),
  `prepare/` (the prepare step's outputs, $RESPAWN_PREPARE_DIR) and
  `prepare-result.json` (how that step went; `prepare` module).
- the prepare step (`prepare_command`) runs before the trainer, watched like it
  (heartbeats, notices, stops); the trainer starts only once its outputs are in
  place, with $RESPAWN_PREPARE_DIR and $RESPAWN_PREPARE_URI set.
- notice file: `{"source", "notice_time", "deadline", "cloud_deadline"}`, where
  `deadline` is the one to meet (the notice budget, never past the cloud's) and
  `cloud_deadline` what the cloud stated (null when unknown).
- status file keys read: `step`, `loss`, `samples_per_s`, `last_checkpoint_step`,
  `checkpoint_save_s`, `checkpoint_stall_s`, and at the end `artifact_uri`,
  `artifact_digest` for the exit report.
- a checkpoint of kind `notice` (or `final`) committed after a notice is the
  notice checkpoint: it ends the wait, and only then is an Azure event acknowledged.
"""
