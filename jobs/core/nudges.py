"""Work handed to the Celery workers, sent by task name.

The core and the fleet ask for work here instead of importing `respawn_server.jobs.tasks`, which
imports them: a message names its task, so sending needs only the name. The names
are the ones `respawn_server.jobs.tasks` registers, and they never change: a deployed broker may
hold messages sent under them. A message is only a nudge (the database is the
truth); each task's retry options are its own and apply in the worker."""

from __future__ import annotations

from celery import current_app
from django.db import transaction

SCHEDULE = "respawn_server.jobs.tasks.schedule"
LAUNCH_INSTANCE = "respawn_server.jobs.tasks.launch_instance"
TERMINATE_INSTANCE = "respawn_server.jobs.tasks.terminate_instance"
CHECK_GANG_FAILURE = "respawn_server.jobs.tasks.check_gang_failure"
CHECK_ELASTIC_GANG = "respawn_server.jobs.tasks.check_elastic_gang"
LAUNCH_SPARE = "respawn_server.jobs.tasks.launch_spare"
DELIVER_NOTIFICATION = "respawn_server.jobs.tasks.deliver_notification"
RUN_DRILL = "respawn_server.jobs.tasks.run_drill"


def send(task: str, *args) -> None:
    current_app.send_task(task, args)


def send_on_commit(task: str, *args) -> None:
    """Sent once the caller's transaction commits, so the worker finds what it is sent about."""
    transaction.on_commit(lambda: send(task, *args))
