"""The job page's drill: a member's form posting a drill (the same service the API uses:
intent recorded, a task queued), and the latest drill's report shown on the page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from respawn_server.frontend import access
from respawn_server.jobs.drills import report
from respawn_server.jobs.drills.services import DrillConflict, request_drill
from respawn_server.jobs.models import Drill


@require_POST
@login_required
def job_drill(request, pk: int):
    job = access.scoped_job(request.user, pk, "job.drill")
    raw = request.POST.get("node", "0")
    if not (raw.isascii() and raw.isdigit() and int(raw) < job.nodes):
        messages.error(request, f"node must be a whole number from 0 to {job.nodes - 1}")
        return redirect("job", pk=job.pk)
    try:
        drill = request_drill(job, by=request.user, rank=int(raw), with_notice=not request.POST.get("without_notice"))
    except DrillConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, f"drill {drill.pk} requested: node {drill.rank} is interrupted through its cloud")
    return redirect("job", pk=job.pk)


def report_of(drill_id: int | None) -> dict | None:
    """The report of the drill (`reads.latest_drill_id`'s answer), derived as it is read; None for none."""
    if drill_id is None:
        return None
    return report.as_report(Drill.objects.select_related("requested_by").get(pk=drill_id))
