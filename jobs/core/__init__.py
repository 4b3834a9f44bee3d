"""The domain core: states and enums, status transitions, domain operations, the audit
log, job logs, and nudges (work sent to the workers by task name).

Imports `respawn_server.jobs.models` and nothing of the subsystems: they import the core."""
