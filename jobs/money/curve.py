"""Cumulative spend and on-demand baseline over time, from the API's instance documents
(`respawn_server.jobs.api.costs.job_cost_data`'s `instances`): the job page's cost chart and the savings
report's cumulative savings, so the two draw the same money the same way."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

COST_POINTS = 120


def cost_curve(detail: dict, now: dt.datetime) -> list[dict]:
    """Cumulative spend and on-demand baseline over time. Each instance's money (and
    its stopped disk's, after its end) accrues evenly over its billed interval: exact at every interval's end and at
    now, a straight line in between (drawn in floats; what has ended is summed
    exactly, so the last point is the figure the API gives)."""
    if not detail["instances"]:
        return []
    spans = []
    for i in detail["instances"]:
        disk = i["stopped_disk"]
        disk_spent = Decimal(disk["spent"]) if disk else Decimal(0)
        spans.append((_moment(i["billed_from"], now), _moment(i["billed_to"], now),
                      Decimal(i["spent"]) - disk_spent, Decimal(i["on_demand_baseline"])))
        if disk:  # after the VM's end, its stopped disk accrues until released
            spans.append((_moment(disk["billed_from"], now), _moment(disk["billed_to"], now), disk_spent, Decimal(0)))
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)  # a finished job's curve ends with it
    moments = sorted({first, last, *(s[0] for s in spans), *(s[1] for s in spans)})
    if len(moments) < COST_POINTS:
        step = (last - first) / COST_POINTS
        moments = sorted(set(moments) | {first + step * i for i in range(COST_POINTS)})
    by_end = sorted(((start.timestamp(), end.timestamp(), paid, on_demand) for start, end, paid, on_demand in spans),
                    key=lambda s: s[1])
    ended, spent, baseline = 0, Decimal(0), Decimal(0)
    curve = []
    for moment in moments:
        at = moment.timestamp()
        while ended < len(by_end) and by_end[ended][1] <= at:
            spent, baseline = spent + by_end[ended][2], baseline + by_end[ended][3]
            ended += 1
        accruing_spent = accruing_baseline = 0.0
        for start, end, paid, on_demand in by_end[ended:]:
            if at > start:
                share = (at - start) / (end - start)
                accruing_spent += float(paid) * share
                accruing_baseline += float(on_demand) * share
        curve.append({"at": moment.isoformat(), "spent": float(spent) + accruing_spent,
                      "on_demand": float(baseline) + accruing_baseline})
    return curve


def _moment(text: str | None, now: dt.datetime) -> dt.datetime:
    return dt.datetime.fromisoformat(text) if text else now
