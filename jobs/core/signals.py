"""Signals sent in the transaction of a happening people may be told of.

The core and the subsystems send them; `respawn_server.jobs.notify` receives them (connected in
JobsConfig.ready) without the senders importing it. A receiver only writes rows in
the sender's transaction: anything slow (a webhook, an email) goes to a worker after
commit, so no endpoint can slow the path that sent the signal."""

from django.dispatch import Signal

job_status_changed = Signal()  # job_id, old, new, fields (what the transition wrote besides the status)
checkpoint_invalid = Signal()  # checkpoint
budget_warning = Signal()  # team, warning
launch_held = Signal()  # job, reason
