"""The control plane's domain, one subpackage per subsystem.

- `models/`: the tables of every subsystem, one module each, under all of them
  (its docstring says why they are not in the subsystems' folders).
- `core/`: what happens to jobs and instances — the enums and transition tables
  (choices), the guarded status writes (transitions), the operations on jobs
  (services), the audit log, job logs, and the work handed to workers by task
  name (nudges). Imports only `respawn_server.jobs.models` and itself.
- `fleet/`: the VMs — cloud providers, the configured-provider registry, the
  scheduler, new instance rows, the launcher, the reconcile sweeps, post steps,
  placement and its pure policies, the heartbeat hot path.
- `recovery/`: what a job does when its VMs end or are about to — the decisions
  after an end, spares, elastic regroup and joiners, a gang's nodes and rendezvous.
- `reports/`: what the agents report (register, notices, checkpoints, exits),
  handed to recovery.
- `money/`: the price book and its price refreshers, the cost ledger, costs from the
  database, budgets, and money as people read it.
- `people/`: token authentication, personal and agent tokens, the permission
  table, team administration.
- `notify/`: notifications (DESIGN §11): subscriptions, the rows a happening writes
  (heard through `core.signals`), URL checks, and sending with retries.
- `api/`: the REST API (people's and agents') and Prometheus `/metrics`.

At the top, Django's and Celery's conventions: admin, apps, tasks (the task names
are a wire contract), migrations, management commands.

Imports point one way: core ← fleet, money, people, recovery, reports ← api,
tasks, management, frontend. A subsystem may use another's modules (the fleet
prices with money's costs; recovery places spares with the fleet's placement, and
the fleet's launcher and reconciler hand an instance's end to recovery) but never
api, tasks or frontend; no two modules import each other, even through others, and
recovery imports nothing that calls it; the tables (models/) import only the
core's choices (tests/test_layout.py).
"""
