"""The team's notifications page: the subscriptions a person sees (the team's, their
own), the delivery log with each attempt, a form to subscribe and a test button.

As on the other pages, the form only shapes what was typed and the API's serializer
decides, so the page and the API refuse the same URLs and fields. A webhook's secret
is shown on the answer to its creation, never again."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from respawn_server.frontend import access
from respawn_server.frontend.forms import DashboardForm
from respawn_server.frontend.views import page
from respawn_server.jobs.api.notifications import SCOPES, SubscriptionSerializer, shown_url, visible_subscriptions
from respawn_server.jobs.core.choices import Channel, NotificationKind
from respawn_server.jobs.models import Delivery
from respawn_server.jobs.notify import subscriptions
from respawn_server.jobs.people.permissions import can

DELIVERIES_SHOWN = 50


class SubscriptionForm(DashboardForm):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. on-call Slack")
    scope = forms.ChoiceField(choices=[(s, s) for s in SCOPES], initial="personal",
                              help_text="team: everyone's jobs (team admins only); personal: your own jobs")
    channel = forms.ChoiceField(choices=Channel.CHOICES)
    url = forms.CharField(required=False, max_length=2000, label="URL", help_text="For a webhook or Slack")
    email = forms.EmailField(required=False, help_text="For email")
    events = forms.MultipleChoiceField(choices=[(k, NotificationKind.LABELS[k]) for k in NotificationKind.SUBSCRIBABLE],
                                       widget=forms.CheckboxSelectMultiple)
    preemption_burst = forms.IntegerField(min_value=1, initial=3, label="Preemptions in an hour that make a burst")
    recovering_after_min = forms.IntegerField(min_value=1, initial=30, label="Recovering longer than (minutes)")

    def serializer(self, request, team) -> SubscriptionSerializer:
        data = {**self.cleaned_data, "team": team.pk}
        data["recovering_after_s"] = data.pop("recovering_after_min") * 60
        return SubscriptionSerializer(data=data, context={"request": request})


def _page(request, team, *, form=None, http_status=200, created=None):
    user = request.user
    shown = list(visible_subscriptions(user).filter(team=team).select_related("user").order_by("user", "name", "id"))
    manages_team = can(user, "subscription.manage_team", team.pk)
    rows = [{"sub": sub, "url": sub.url if sub.user_id or manages_team else shown_url(sub.url),
             "may_manage": subscriptions.may_manage(user, team_id=team.pk, owner_id=sub.user_id),
             "events": ", ".join(NotificationKind.LABELS[k] for k in sub.events)} for sub in shown]
    deliveries = (Delivery.objects.filter(subscription__in=shown).select_related("notification", "subscription")
                  .prefetch_related("attempt_log").order_by("-created_at", "-id")[:DELIVERIES_SHOWN])
    return page(request, "frontend/notifications.html", http_status=http_status, team=team, rows=rows,
                deliveries=deliveries, form=form or SubscriptionForm(), manages_team=manages_team, created=created)


@login_required
def notifications_page(request, pk: int):
    return _page(request, access.scoped_team(request.user, pk))


@never_cache  # the answer may hold a webhook's secret: no cache may keep it
@require_POST
@login_required
def subscription_create(request, pk: int):
    team = access.scoped_team(request.user, pk)
    form = SubscriptionForm(request.POST)
    if form.is_valid():
        body = form.serializer(request, team)
        if body.is_valid():
            fields = dict(body.validated_data)
            owner = None if fields.pop("scope") == "team" else request.user
            if not subscriptions.may_manage(request.user, team_id=team.pk, owner_id=owner and owner.pk):
                raise PermissionDenied("Only the team's admins manage its subscriptions.")
            created = subscriptions.create(**fields, user=owner, created_by=request.user)
            return _page(request, team, http_status=201, created=created)
        form.take_errors(body)
    return _page(request, team, form=form, http_status=400)


def _managed(request, pk: int, sub_pk: int):
    team = access.scoped_team(request.user, pk)
    subscription = get_object_or_404(visible_subscriptions(request.user), pk=sub_pk, team=team)
    if not subscriptions.may_manage(request.user, team_id=team.pk, owner_id=subscription.user_id):
        raise PermissionDenied("Only the team's admins manage its subscriptions.")
    return team, subscription


@require_POST
@login_required
def subscription_test(request, pk: int, sub_pk: int):
    team, subscription = _managed(request, pk, sub_pk)
    subscriptions.send_test(subscription, request.user)
    messages.success(request, f"Test message queued for {subscription.name}; its delivery is in the log below.")
    return redirect("team-notifications", pk=team.pk)


@require_POST
@login_required
def subscription_delete(request, pk: int, sub_pk: int):
    team, subscription = _managed(request, pk, sub_pk)
    subscription.delete()
    messages.success(request, f"Subscription {subscription.name} deleted.")
    return redirect("team-notifications", pk=team.pk)
