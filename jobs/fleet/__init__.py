"""The fleet: where VMs run and whether they still do. Cloud providers (`providers/`,
no Django), the configured-provider registry, the scheduler (`scheduler`, and
`post_steps`), new instance rows (`instances`), the launcher (launch, terminate), the
reconcile sweeps (`reconciler` over live instances, `leftovers` over VMs let go),
placement over the pure policies (`policies/`, stdlib only), and the heartbeat hot path.

Imports the core, money (prices, budgets), people (bootstrap tokens), and recovery,
to which the scheduler, launcher and reconciler hand a gang's rendezvous and an
instance's end; what recovery imports of the fleet (placement, `instances`,
`providers`) imports nothing of recovery (tests/test_layout.py)."""
