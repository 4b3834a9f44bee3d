from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from jobs.models import Job
from jobs.permissions import visible_team_ids


@login_required
def home(request):
    jobs = Job.objects.filter(team_id__in=visible_team_ids(request.user)).select_related("team", "owner")[:50]
    return render(request, "frontend/home.html", {"jobs": jobs})
