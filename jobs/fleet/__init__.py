"""The fleet: where VMs run and whether they still do. Cloud providers (`providers/`,
no Django), the configured-provider registry, orchestration (schedule, launch,
terminate, reconcile), placement over the pure policies (`policies/`, stdlib only),
and the heartbeat hot path.

Imports the core, and money (prices, budgets) and people (bootstrap tokens)."""
