"""Filters of the people's API. A related object is filtered by its id as a plain
number: a choice field would check the id exists, and so answer another team's
job or team (there, but not yours: an empty list) unlike an unknown one (400).
Both now give the same empty list."""

from __future__ import annotations

from django import forms
from django.db import models
from django_filters import Filter
from django_filters.rest_framework import DjangoFilterBackend, FilterSet
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS


class IdField(forms.IntegerField):
    """A database id: a positive 64-bit integer, so a huge one is a 400, not a query that overflows."""

    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=2**63 - 1, **kwargs)


class IdFilter(Filter):
    field_class = IdField


class IdFilterSet(FilterSet):
    FILTER_DEFAULTS = {**FILTER_FOR_DBFIELD_DEFAULTS,
                       models.ForeignKey: {"filter_class": IdFilter},
                       models.OneToOneField: {"filter_class": IdFilter}}


class IdFilterBackend(DjangoFilterBackend):
    """Viewsets that list only `filterset_fields` get an IdFilterSet too."""

    filterset_base = IdFilterSet
