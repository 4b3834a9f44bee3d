"""Reading our ids back from a VM's tags or labels."""

from __future__ import annotations

from collections.abc import Mapping


def ids_from_tags(tags: Mapping[str, str], *, job_key: str, instance_key: str) -> tuple[int | None, int | None]:
    """(job id, instance id) from a VM's tags; None where a tag is missing or not a number."""
    return _int_or_none(tags.get(job_key)), _int_or_none(tags.get(instance_key))


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
