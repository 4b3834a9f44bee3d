"""Filters of the people's API. A related object is filtered by its id as a plain
number: a choice field would check the id exists, and so answer another team's
job or team (there, but not yours: an empty list) unlike an unknown one (400).
Both now give the same empty list. A moment is compared in UTC, whatever offset it
was written with (UtcDateTimeFilter)."""

from __future__ import annotations

import datetime as dt

from django import forms
from django.db import models
from django_filters import Filter, IsoDateTimeFilter
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend, FilterSet
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS


class IdField(forms.IntegerField):
    """A database id: a positive 64-bit integer, so a huge one is a 400, not a query that overflows."""

    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=2**63 - 1, **kwargs)


class IdFilter(Filter):
    field_class = IdField


class UtcDateTimeField(IsoDateTimeField):
    """A moment as UTC. Python reads offsets up to ±23:59, PostgreSQL refuses those beyond
    ±15:59 (a 500), and one that moves the moment out of years 1..9999 cannot be read."""

    def to_python(self, value):
        moment = super().to_python(value)
        try:
            return moment.astimezone(dt.UTC) if moment is not None else None
        except OverflowError:
            raise forms.ValidationError("in UTC this moment falls outside the years 1 to 9999", code="invalid") from None


class UtcDateTimeFilter(IsoDateTimeFilter):
    field_class = UtcDateTimeField


class IdFilterSet(FilterSet):
    FILTER_DEFAULTS = {**FILTER_FOR_DBFIELD_DEFAULTS,
                       models.ForeignKey: {"filter_class": IdFilter},
                       models.OneToOneField: {"filter_class": IdFilter},
                       models.DateTimeField: {"filter_class": UtcDateTimeFilter}}


class IdFilterBackend(DjangoFilterBackend):
    """Viewsets that list only `filterset_fields` get an IdFilterSet too."""

    filterset_base = IdFilterSet
