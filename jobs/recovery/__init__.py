"""Recovery: what a job does when its VMs end or are about to. The decisions after an
instance's end (`after_end`), spares (`spares`) and the noticed VM's state handed
straight to its spare's store (`handover`), an elastic gang going on smaller
(`elastic`) and growing back with joiners (`joiners`), a gang's nodes, size and
rendezvous (`gangs`), and which VM ends the job's preemption counter counts (`counting`).

Imports the core, money's budget, and from the fleet only what places a VM (placement,
`instances`, the providers' `Placement`); never the fleet's scheduler, launcher or
reconciler, which call it, nor the reports, the API, tasks or the dashboard
(tests/test_layout.py). Work it hands on (a spare to launch, a gang to check with the
cloud) goes by task name (`respawn_server.jobs.core.nudges`)."""
