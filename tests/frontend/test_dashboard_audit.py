"""Jobs submitted or cancelled through the dashboard are audited like the API's."""

from django.test import Client

from respawn_server.jobs.models import AuditEvent, Job
from tests.factories import make_team_with_members


def test_dashboard_submit_and_cancel_are_audited(db):
    setup = make_team_with_members()
    member = setup.people["member"].user
    browser = Client()
    browser.force_login(member)
    response = browser.post(f"/teams/{setup.team.pk}/submit/", {"name": "from-the-form", "command": "python train.py", "priority": 0})
    assert response.status_code == 302, response.content[:500]
    job = Job.objects.get(name="from-the-form")
    browser.post(f"/jobs/{job.pk}/cancel/")
    actions = list(AuditEvent.objects.filter(target=f"job:{job.pk}").order_by("pk").values_list("action", "actor_username"))
    assert actions == [("job.submitted", member.username), ("job.cancelled", member.username)]
