"""Drills (issue 38): a member interrupts a running VM of a job through its own cloud's
API, on purpose, so the whole recovery path runs for real (notice source, notice save,
spare or relaunch, restore, validation) and is reported against the job's notice window.

A drill is recorded as a drill: its own interruption kind on the timeline, and the
interruption it causes is not a preemption (respawn_server.jobs.core.drilled.caused_by_drill):
it moves no preemption counter, no learned interruption rate and no back-off. A real
preemption of another VM meanwhile still counts. What it spends is shown apart from the
job's spot money (respawn_server.jobs.money.ledger.Drill), and its report is derived from
the job's rows whenever it is read (report.recovery).

Imports the core (models, transitions, audit, nudges) and the fleet's provider registry
(in the task only); the core asks it whether an interruption was a drill's, the API and
the dashboard read its reports."""
