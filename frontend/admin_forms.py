"""Forms of the team settings and API tokens pages. As with job submission, each
only shapes what a person typed; the API's serializer decides, so the dashboard
and the API accept and refuse the same members, limits and tokens."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from respawn_server.frontend.forms import DashboardForm
from respawn_server.jobs.api.teamadmin import AddMemberSerializer, TeamLimitsSerializer
from respawn_server.jobs.api.tokens import ApiTokenSerializer
from respawn_server.jobs.core.choices import Role

MAX_TOKEN_DAYS = 3650


class AddMemberForm(DashboardForm):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.CHOICES, initial=Role.MEMBER)

    def serializer(self, team) -> AddMemberSerializer:
        return AddMemberSerializer(data=self.cleaned_data, context={"team": team})


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.CHOICES)


class LimitsForm(DashboardForm):
    monthly_budget_usd = forms.DecimalField(required=False, min_value=0, max_digits=12, decimal_places=2,
                                            label="Monthly budget (USD)", help_text="Empty: no budget")
    max_concurrent_gpus = forms.IntegerField(required=False, min_value=0, label="Max concurrent GPUs",
                                             help_text="Empty: no limit")

    @classmethod
    def of(cls, team) -> LimitsForm:
        return cls(initial={name: getattr(team, name) for name in cls.base_fields})

    def serializer(self, team, by) -> TeamLimitsSerializer:
        # An empty field arrives as None, which lifts that limit.
        return TeamLimitsSerializer(team, data=self.cleaned_data, partial=True, context={"by": by})


class NewTokenForm(DashboardForm):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. laptop CLI")
    expires_in_days = forms.IntegerField(required=False, min_value=1, max_value=MAX_TOKEN_DAYS,
                                         label="Expires in (days)", help_text="Empty: never expires")

    def serializer(self, request) -> ApiTokenSerializer:
        days = self.cleaned_data["expires_in_days"]
        expires_at = timezone.now() + timedelta(days=days) if days else None
        return ApiTokenSerializer(data={"name": self.cleaned_data["name"], "expires_at": expires_at},
                                  context={"request": request})
