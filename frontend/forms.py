"""Forms of the dashboard. The submit form only shapes what a person typed; the
API's JobSerializer decides what a valid job is, so the page and the API accept
and refuse exactly the same jobs."""

from __future__ import annotations

import shlex

from django import forms
from django.conf import settings

from respawn_server.jobs.api.serializers import KNOWN_CLOUDS, JobSerializer
from respawn_server.jobs.core.choices import JobStatus


def configured_clouds() -> list[str]:
    """The clouds this deployment can launch on (RESPAWN_PROVIDERS), in the API's order."""
    return [cloud for cloud in KNOWN_CLOUDS if cloud in settings.RESPAWN["PROVIDERS"]]


class JobFilterForm(forms.Form):
    STATUS_CHOICES = JobStatus.CHOICES
    CLOUD_CHOICES = [("", "any cloud"), *[(c, c) for c in KNOWN_CLOUDS]]

    status = forms.MultipleChoiceField(choices=STATUS_CHOICES, required=False)
    owner = forms.CharField(required=False, max_length=150)
    cloud = forms.ChoiceField(choices=CLOUD_CHOICES, required=False)
    q = forms.CharField(required=False, max_length=200, label="Search")
    # Bounded so the page's first row stays a number the database can count to.
    page = forms.IntegerField(required=False, min_value=1, max_value=10**6)


class PriceFilterForm(forms.Form):
    """The prices page's filters, checked like any form (a NUL reached PostgreSQL: a 500)."""

    provider = forms.CharField(required=False, max_length=20)
    type = forms.CharField(required=False, max_length=50)


class DashboardForm(forms.Form):
    """A form whose API serializer has the last word: its refusals are shown by field."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            if field.help_text:  # the template renders it with this id
                field.widget.attrs["aria-describedby"] = f"{self.auto_id % name}-help"

    def take_errors(self, serializer) -> None:
        for field, messages in serializer.errors.items():
            for message in messages:
                self.add_error(field if field in self.fields else None, f"{field}: {message}")


class SecretLines(forms.Textarea):
    """Never sends what was typed back to the browser, not even to correct it: a
    refused form comes back with this field empty."""

    def format_value(self, value):
        return None


class SubmitJobForm(DashboardForm):
    name = forms.CharField(max_length=200)
    command = forms.CharField(max_length=2000, help_text="As you would type it in a shell, e.g. python train.py --lr 3e-4")
    total_steps = forms.IntegerField(required=False, min_value=1)
    instance_types = forms.CharField(required=False, max_length=500, help_text="Comma-separated, e.g. g5.xlarge, g6.xlarge")
    # Only what can launch: the API refuses the other clouds anyway (400 naming allowed_clouds).
    allowed_clouds = forms.MultipleChoiceField(choices=lambda: [(c, c) for c in configured_clouds()], required=False,
                                               widget=forms.CheckboxSelectMultiple)
    max_price_per_hour = forms.DecimalField(required=False, min_value=0, decimal_places=4, label="Max price per hour (USD)")
    checkpoint_interval_s = forms.FloatField(required=False, min_value=1, label="Checkpoint interval (s)",
                                             help_text="Empty: chosen from measured checkpoint cost and interruption rate")
    priority = forms.IntegerField(initial=0, min_value=-100, max_value=100)
    secret_env = forms.CharField(
        required=False, max_length=20000, label="Secret environment", widget=SecretLines(attrs={"rows": 2, "autocomplete": "off"}),
        help_text="One NAME=value a line: stored encrypted, given only to the job's VMs, never shown again")

    def clean_secret_env(self):
        values = {}
        for number, line in enumerate(self.cleaned_data["secret_env"].splitlines(), 1):
            name, sep, value = line.partition("=")
            if not line.strip():
                continue
            if not sep or not name.strip():
                raise forms.ValidationError(f"line {number} is not NAME=value")
            values[name.strip()] = value
        return values

    def clean_command(self):
        try:
            argv = shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise forms.ValidationError(f"cannot split the command: {exc}") from None
        if not argv:
            raise forms.ValidationError("the command is empty")
        return argv

    def clean_instance_types(self):
        return [t.strip() for t in self.cleaned_data["instance_types"].split(",") if t.strip()]

    def serializer(self, team, context) -> JobSerializer:
        data = {key: value for key, value in self.cleaned_data.items() if value not in (None, "")}
        data["team"] = team.pk
        return JobSerializer(data=data, context=context)
