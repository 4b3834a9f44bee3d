"""What the agents report about their instances: the register, notices and rebalance
recommendations, checkpoints and their verdicts, the prepare step, the exit. Each
report is recorded here and handed to `respawn_server.jobs.recovery` where it ends an
instance or calls for a spare; the agents' API views are thin over these.

Imports the core and recovery; never the fleet's scheduler, launcher or reconciler, the
API, tasks or the dashboard (tests/test_layout.py)."""
