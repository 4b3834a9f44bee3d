"""Dashboard pages (Django templates) and the JSON status views their scripts poll.

Every view asks `respawn_server.frontend.access` (the one permission table) before reading a
team's data; JSON views answer 401 to an anonymous caller instead of a login page."""

from __future__ import annotations

from functools import cache, wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from respawn_server.frontend import access, drills, money, reads, selectors, story
from respawn_server.frontend.forms import JobFilterForm, PriceFilterForm, SubmitJobForm, configured_clouds
from respawn_server.jobs.core import trackers
from respawn_server.jobs.core.services import cancel_job
from respawn_server.jobs.models import PriceQuote
from respawn_server.jobs.money import downtime
from respawn_server.jobs.money.costs import CostError, parse_month
from respawn_server.jobs.people.permissions import can

SUBMIT_FIELDS = "frontend/_submit_fields.html"


def json_view(view):
    """Signed-in only (401, not a redirect), never cached, GET only."""

    @wraps(view)
    @never_cache
    @require_GET
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "Sign in first."}, status=401)
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return JsonResponse({"detail": str(exc) or "Not allowed."}, status=403)

    return wrapper


def page(request, template: str, http_status: int = 200, teams=None, **context):
    teams = access.visible_teams(request.user) if teams is None else teams
    return render(request, template, {"teams": teams, "current_team": access.current_team(request, teams),
                                      **context}, status=http_status)


# ---- jobs list --------------------------------------------------------------------------------

def _jobs_page(request, team_id: int | None, *also: reads.Read):
    """(filter form, paginator page, rows, answers of `also`) for the chosen team, or
    the form's errors; `also` are read in the same round trip as the page."""
    form = JobFilterForm(request.GET)
    if team_id is None or not form.is_valid():
        return form, None, [], reads.batch(*also) if also else []
    access.require(request.user, "job.view", team_id)
    f = form.cleaned_data
    number = f["page"] or 1
    jobs = selectors.filtered_jobs(team_id, statuses=f["status"], owner=f["owner"], cloud=f["cloud"], search=f["q"],
                                   page=number)
    also = jobs.load((number - 1) * selectors.JOBS_PER_PAGE, selectors.JOBS_PER_PAGE, *also)
    current = Paginator(jobs, selectors.JOBS_PER_PAGE).get_page(number)
    return form, current, selectors.job_rows(list(current.object_list)), also


@login_required
def home(request):
    team_id = access.current_team_id(request)
    owners = [reads.team_usernames(team_id)] if team_id else []
    form, current, rows, (teams, *found) = _jobs_page(request, team_id, access.team_choices(request.user), *owners)
    query = request.GET.copy()
    query.pop("page", None)
    return page(request, "frontend/jobs.html", http_status=200 if form.is_valid() else 400, teams=teams,
                form=form, page=current, rows=rows, query=query.urlencode(),
                filters=_filter_choices(request.GET, found[0] if found else []))


def _filter_choices(asked, owners: list[str]) -> dict:
    """The filter form's options, each with whether it is the one asked for."""
    statuses, owner, cloud = asked.getlist("status"), asked.get("owner"), asked.get("cloud", "")
    return {"statuses": [(value, label, value in statuses) for value, label in JobFilterForm.STATUS_CHOICES],
            "owners": [(name, name == owner) for name in owners],
            "clouds": [(value, label, value == cloud) for value, label in JobFilterForm.CLOUD_CHOICES],
            "q": asked.get("q", "")}


@json_view
def jobs_json(request):
    team_id = access.current_team_id(request)
    form, current, rows, _ = _jobs_page(request, team_id)
    if not form.is_valid():
        return JsonResponse({"detail": "invalid filters", "errors": form.errors}, status=400)
    return JsonResponse({"team": team_id, "rows": rows,
                         "count": current.paginator.count if current else 0,
                         "count_capped": current.paginator.object_list.capped if current else False})


@require_POST
@login_required
def switch_team(request):
    try:
        team_id = int(request.POST.get("team", ""))
    except ValueError:
        team_id = -1
    team = access.scoped_team(request.user, team_id)
    request.session[access.SESSION_TEAM] = team.pk
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "/"
    return redirect(target)


# ---- one job ----------------------------------------------------------------------------------

@login_required
def job_page(request, pk: int):
    """The job's summary and the checkpoint interval; its script fetches the rest
    (timeline, charts, tables) from `job_json` at once, then polls it."""
    # One round trip: the job's own reads go with its row and are dropped if it may not be seen.
    job, teams, interval, fit, tracked, drill_id, *downtime_rows = reads.batch(
        reads.job(pk), access.team_choices(request.user), reads.checkpoint_interval(pk), reads.save_fit(pk),
        reads.tracked_job(pk), reads.latest_drill_id(pk), *reads.downtime(pk))
    access.require_job_row(request.user, job)
    now = timezone.now()
    summary = selectors.job_summary(job, selectors.job_money(job, now), now=now,
                                    may_cancel=can(request.user, "job.cancel", job["team_id"]))
    interval = interval and story.interval_words(**interval)
    downtime_s, interruptions = downtime.job_downtime(pk, now, downtime_rows)
    return page(request, "frontend/job.html", teams=teams, job=job, status=summary, interval=interval,
                save_warning=story.save_fit_warning(fit), tracker_links=trackers.links(tracked), downtime_s=downtime_s,
                interruptions=interruptions, may_drill=can(request.user, "job.drill", job["team_id"]),
                drill=drills.report_of(drill_id))


@json_view
def job_json(request, pk: int):
    job = access.scoped_job_row(request.user, pk)
    return JsonResponse(selectors.job_status(job, may_cancel=can(request.user, "job.cancel", job["team_id"])))


MAX_CURSOR = 2**63 - 1


@json_view
def job_log_json(request, pk: int):
    """The job's log from its first line on (`after`: the `next` of the previous answer)."""
    job = access.scoped_job_row(request.user, pk)
    raw = request.GET.get("after", "0")
    if not (raw.isascii() and raw.isdigit() and int(raw) <= MAX_CURSOR):
        message = f"after must be a whole number from 0 to {MAX_CURSOR}"
        return JsonResponse({"detail": message, "errors": {"after": [message]}}, status=400)
    return JsonResponse(selectors.job_log(job["id"], int(raw)))


@require_POST
@login_required
def job_cancel(request, pk: int):
    job = access.scoped_job(request.user, pk, "job.cancel")
    cancelled = cancel_job(job, by=request.user)
    job.refresh_from_db(fields=["status"])
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"status": job.status, "cancelled": cancelled}, status=202 if cancelled else 409)
    return redirect("job", pk=job.pk)


# ---- team overview ----------------------------------------------------------------------------

def _team_page(request, team_id: int, month: str | None = None, form: SubmitJobForm | None = None, http_status=200):
    """The overview of `month` (checked; None: this month); `form` is a submitted form to show again with its errors."""
    team, data, (teams,) = selectors.team_status(team_id, month, access.team_choices(request.user))
    rates = money.placement_rates(team.pk)
    may_submit = can(request.user, "job.create", team.pk)
    return page(request, "frontend/team.html", http_status=http_status, teams=teams, team=team, data=data, rates=rates,
                may_submit=may_submit, submit_fields=_submit_fields(form) if may_submit else "",
                role=access.role_in(request.user, team.pk))


def _submit_fields(form: SubmitJobForm | None) -> str:
    return _blank_submit_fields() if form is None else render_to_string(SUBMIT_FIELDS, {"form": form})


@cache
def _blank_submit_fields() -> str:
    """An empty submit form is the same for everyone: rendered once, as its widgets
    were most of the overview's rendering time."""
    return render_to_string(SUBMIT_FIELDS, {"form": SubmitJobForm()})


@login_required
def team_page(request, pk: int):
    access.require(request.user, "team.view", pk)
    month_error = _month_error(request)
    if month_error:
        return page(request, "frontend/error.html", http_status=400, message=month_error)
    if request.session.get(access.SESSION_TEAM) != pk:
        request.session[access.SESSION_TEAM] = pk
    return _team_page(request, pk, request.GET.get("month") or None)


def _month_error(request) -> str | None:
    try:
        parse_month(request.GET.get("month") or None, timezone.now())
    except CostError as exc:
        return str(exc)
    return None


@json_view
def team_json(request, pk: int):
    access.require(request.user, "team.view", pk)
    month_error = _month_error(request)
    if month_error:
        return JsonResponse({"detail": month_error, "errors": {"month": [month_error]}}, status=400)
    return JsonResponse(selectors.team_status(pk, request.GET.get("month") or None)[1])


@require_POST
@login_required
def team_submit(request, pk: int):
    """Create a job through the API's serializer, so the form accepts what the API accepts."""
    team = access.scoped_team(request.user, pk, "job.create")
    form = SubmitJobForm(request.POST)
    if form.is_valid():
        serializer = form.serializer(team, {"request": request})
        if serializer.is_valid():
            job = serializer.save(owner=request.user)
            return redirect("job", pk=job.pk)
        form.take_errors(serializer)
    return _team_page(request, team.pk, form=form, http_status=400)


# ---- prices -----------------------------------------------------------------------------------

@login_required
def prices(request):
    if not can(request.user, "price.view", None):
        raise PermissionDenied("You cannot see prices.")
    form = PriceFilterForm(request.GET)
    if not form.is_valid():
        message = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
        return page(request, "frontend/error.html", http_status=400, message=message)
    provider, instance_type = form.cleaned_data["provider"], form.cleaned_data["type"]
    launchable = configured_clouds()
    rows = selectors.price_rows(selectors.latest_prices(provider=provider, instance_type=instance_type), launchable)
    current = Paginator(rows, 100).get_page(request.GET.get("page") or 1)
    providers = PriceQuote.objects.order_by("provider").values_list("provider", flat=True).distinct()
    return page(request, "frontend/prices.html", quotes=current, provider=provider, instance_type=instance_type,
                providers=providers, launchable=launchable)
