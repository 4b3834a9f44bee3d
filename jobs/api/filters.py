"""Filters of the people's API. A related object is filtered by its id as a plain
number: a choice field would check the id exists, and so answer another team's
job or team (there, but not yours: an empty list) unlike an unknown one (400).
Both now give the same empty list."""

from __future__ import annotations

from django.db import models
from django_filters import NumberFilter
from django_filters.rest_framework import DjangoFilterBackend, FilterSet
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS


class IdFilterSet(FilterSet):
    FILTER_DEFAULTS = {**FILTER_FOR_DBFIELD_DEFAULTS,
                       models.ForeignKey: {"filter_class": NumberFilter},
                       models.OneToOneField: {"filter_class": NumberFilter}}


class IdFilterBackend(DjangoFilterBackend):
    """Viewsets that list only `filterset_fields` get an IdFilterSet too."""

    filterset_base = IdFilterSet
