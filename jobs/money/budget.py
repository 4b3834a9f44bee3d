"""Monthly budgets: a launch that would push the team's projected month spend past
its budget waits; running jobs are never killed for it, but the team is warned.

Projected spend = what the ledger says was spent this UTC month + every live
instance's price × the time its job still needs (from measured speed), + the
launch being considered."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.utils import timezone

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.signals import budget_warning
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.fleet.placement import remaining_work_s
from respawn_server.jobs.models import Instance, Team
from respawn_server.jobs.money.costs import CostError, team_month_cost

HOUR = Decimal(3600)
HOLD_PREFIX = "waiting: monthly budget"  # how a held job's status reason starts


@dataclass(frozen=True)
class Projection:
    spent: Decimal
    committed: Decimal  # live instances to their jobs' expected end
    budget: Decimal | None

    @property
    def total(self) -> Decimal:
        return self.spent + self.committed

    def allows(self, extra: Decimal) -> bool:
        return self.budget is None or self.total + extra <= self.budget


def job_remaining_cost(price_per_hour: Decimal, job, nodes: int) -> Decimal:
    return price_per_hour * nodes * Decimal(str(remaining_work_s(job))) / HOUR


def projection(team: Team, now=None) -> Projection:
    now = now or timezone.now()
    if team.monthly_budget_usd is None:
        return Projection(Decimal(0), Decimal(0), None)
    live = Instance.objects.filter(job__team=team, state__in=InstanceState.LIVE).select_related("job")
    committed = sum((job_remaining_cost(i.price_per_hour_at_launch or Decimal(0), i.job, 1) for i in live),
                    Decimal(0))
    return Projection(_month_spent(team, now), committed, team.monthly_budget_usd)


def _month_spent(team: Team, now) -> Decimal:
    """The ledger's figure; an instance that started between `now` and the query is
    a race, so the figure is taken again a moment later (its start is then past)."""
    try:
        return team_month_cost(team, now=now).spent
    except CostError:
        return team_month_cost(team, now=timezone.now()).spent


def hold_reason(team: Team, launch_cost: Decimal) -> str:
    """Why a launch of `launch_cost` (to its expected end) must wait, or '' if it may go."""
    projected = projection(team)
    if projected.allows(launch_cost):
        return ""
    return (f"{HOLD_PREFIX} (${projected.total:.2f} projected + ${launch_cost:.2f} for this job "
            f"> ${projected.budget:.2f})")


def warn_over_budget(team: Team) -> bool:
    """Running jobs are never stopped for the budget; the team is told instead (a job
    event on each active job when the warning first appears, and a dashboard banner)."""
    projected = projection(team)
    warning = "" if projected.allows(Decimal(0)) else (
        f"projected spend this month ${projected.total:.2f} exceeds the budget ${projected.budget:.2f}; "
        "new launches wait, running jobs continue")
    if warning == team.budget_warning:
        return bool(warning)
    Team.objects.filter(pk=team.pk).update(budget_warning=warning)
    if warning:
        for job_id in team.jobs.filter(status__in=JobStatus.ACTIVE).values_list("pk", flat=True):
            log_job_event(job_id, f"budget warning: {warning}")
        budget_warning.send(sender=Team, team=team, warning=warning)
    return bool(warning)
