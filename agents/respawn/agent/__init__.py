"""The on-node agent (`respawn-agent run`, DESIGN §5 and §7).

Modules: `config` (flags and environment), `client` (HTTP calls), `reporter`
(journaled, ordered delivery), `channel` (files shared with the trainer),
`supervisor` (the trainer process), `validation` (low-priority checkpoint
validation), `prepare` (the prepare step, cached by content hash), `lifecycle`
(the run loop; its concerns in `registration`, `setup_steps`, `gang`,
`notice_handling`, `heartbeat_answers`, `dispatch`, `shipping`, `tracker_run`,
`ending`, its state in `state`, the job spec's check in `jobspec`), `session` (what register gave, kept for a restart),
`preflight` (is a script spot-safe).

What the agent adds to the trainer channel of agents/respawn/protocol.py:
- work dir layout: `trainer.log` (the trainer's output, plus lines starting with
  `[respawn-agent]` saying what the agent did), `channel/` (status.json,
  checkpoints.jsonl, control.json, notice.json), `journal/` (offline journal),
  `prepare/` (the prepare step's outputs, $RESPAWN_PREPARE_DIR),
  `prepare-result.json` (how that step went; `prepare` module), `session.json`
  (0600: the agent token and job spec, so a restarted agent resumes; `session`
  module) and `log-position.json` (how much of trainer.log was journaled).
- the prepare step (`prepare_command`) runs before the trainer, watched like it
  (heartbeats, notices, stops); the trainer starts only once its outputs are in
  place, with $RESPAWN_PREPARE_DIR and $RESPAWN_PREPARE_URI set.
- notice file: `{"source", "notice_time", "deadline", "cloud_deadline"}`, where
  `deadline` is the one to meet (the cloud's less a margin, or the default budget
  from a notice that states none) and `cloud_deadline` what the cloud stated (null
  when unknown).
- status file keys read: `step`, `loss`, `samples_per_s`, `last_checkpoint_step`,
  `checkpoint_save_s`, `checkpoint_stall_s`, and at the end `artifact_uri`,
  `artifact_digest` for the exit report.
- a checkpoint of kind `notice` (or `final`) committed after a notice is the
  notice checkpoint: it ends the wait, and only then is an Azure event acknowledged.
"""

# `respawn-agent run` exits with this when the control plane refused the agent
# token of a resumed session (the instance ended or was fenced while the agent was
# down) or the bootstrap token at register: restarting cannot help, so the systemd
# unit's RestartPreventExitStatus names it (jobs/fleet/providers/base.py).
EXIT_INSTANCE_ENDED = 3
