"""What this deployment can place a job on: the clouds it enables, the regions and
instance types its price book prices there, the most accelerators one VM of any
known type carries, and the GPU allowances. A job asking for more waits in the
queue for ever (placement finds nothing, or a GPU limit never frees enough), so
the people's API refuses it at submit, naming the field (respawn_server.jobs.api.serializers)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.conf import settings

from respawn_server.jobs.models import PriceQuote, Team
from respawn_server.jobs.money.pricebook import load_price_book


def usable_clouds(allowed: list[str]) -> list[str]:
    """The enabled clouds a job allowing `allowed` (empty: any) may run on."""
    enabled = settings.RESPAWN["PROVIDERS"]
    return [cloud for cloud in (allowed or enabled) if cloud in enabled]


@dataclass(frozen=True)
class Offer:
    """The priced (cloud, region, instance type) of some clouds."""

    placements: frozenset[tuple[str, str, str]]

    @classmethod
    def of(cls, clouds: list[str]) -> Offer:
        rows = PriceQuote.objects.filter(provider__in=clouds).values_list("provider", "region", "instance_type")
        return cls(frozenset(rows.distinct()))

    @property
    def regions(self) -> set[str]:
        return {region for _, region, _ in self.placements}

    @property
    def instance_types(self) -> set[str]:
        return {instance_type for _, _, instance_type in self.placements}

    def allows(self, regions: list[str], instance_types: list[str]) -> bool:
        """Whether some placement lies in `regions` and has one of `instance_types` (empty: any)."""
        return any((not regions or region in regions) and (not instance_types or kind in instance_types)
                   for _, region, kind in self.placements)


@cache
def max_accelerators_per_node() -> int:
    return max(load_price_book().accelerators.values())


def gpu_allowance_problem(team: Team, gpus: int) -> str | None:
    """Why a job holding `gpus` at once could never start under the GPU allowances, if it could not."""
    for limit, whose in ((team.max_concurrent_gpus, f"team {team.name}'s"),
                         (settings.RESPAWN["MAX_CONCURRENT_GPUS"], "this deployment's")):
        if limit is not None and gpus > limit:
            return (f"the job holds {gpus} accelerators at once (nodes × accelerator_count), more than "
                    f"{whose} limit of {limit}: it could never start")
    return None
