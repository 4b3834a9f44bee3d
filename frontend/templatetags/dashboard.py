"""Rows of the jobs list and of a job's downtime table, rendered in Python: 25 rows of
twenty template variables each were the largest cost of the list page, and a job's
interruptions, a dozen variables each, of the job page. The list's markup is the one
jobs.js builds when it refreshes the rows in place. Texts people or machines wrote are
escaped; the rest is ours (ints, a reversed URL, formatted money and durations)."""

import datetime as dt
from html import escape

from django import template
from django.template.defaultfilters import floatformat
from django.utils.safestring import SafeString, mark_safe

from respawn_server.frontend.story import where_resumed
from respawn_server.jobs.money.downtime import PARTS

register = template.Library()

EMPTY = '<tr class="empty"><td colspan="10">No jobs match.</td></tr>'


def _row(row: dict) -> str:
    reason = f'<span class="reason">{escape(row["status_reason"])}</span>' if row["status_reason"] else ""
    pct = row["progress_pct"]
    progress = (f' / {int(row["total_steps"])} <progress max="100" value="{pct}" aria-label="{pct}% done"></progress>'
                if row["total_steps"] else "")
    status = escape(row["status"])
    return (f'<tr data-job="{int(row["id"])}">\n'
            f'<td class="num" data-field="id">{int(row["id"])}</td>\n'
            f'<td><a href="{row["url"]}">{escape(row["name"])}</a></td>\n'
            f'<td>{escape(row["owner"])}</td>\n'
            f'<td data-field="status"><span class="status s-{status}">{status}</span>{reason}</td>\n'
            f'<td data-field="progress">{int(row["last_step"])}{progress}</td>\n'
            f'<td data-field="eta">{row["eta_display"]}</td>\n'
            f'<td data-field="spent" class="num" data-exact="{row["spent"] or ""}">{row["spent_display"]}</td>\n'
            f'<td data-field="savings" class="num" data-exact="{row["savings"] or ""}">{row["savings_display"]}</td>\n'
            f'<td data-field="interruptions" class="num">{int(row["interruptions"])}</td>\n'
            f'<td data-field="cloud">{escape(row["cloud"] or "–")}</td>\n'
            '</tr>\n')


@register.simple_tag
def job_rows(rows: list[dict]) -> SafeString:
    """The <tr> of each row of `respawn_server.frontend.selectors.job_rows`."""
    return mark_safe("".join(_row(row) for row in rows) if rows else EMPTY)  # noqa: S308 (each text escaped)


def _downtime_row(d) -> str:
    interrupted = d.interrupted.astimezone(dt.UTC)
    replacement = f"#{int(d.replacement_id)}" if d.replacement_id else "–"
    parts = "".join(f'<td class="num">{floatformat(d.parts[name], 0)}</td>' for name in PARTS)
    return (f'<tr><td><time datetime="{interrupted.isoformat()}">{interrupted:%Y-%m-%d %H:%M:%S} UTC</time></td>'
            f'<td>#{int(d.instance_id)} {escape(d.kind)} → {replacement}</td>{parts}'
            f'<td class="num">{floatformat(d.total_s, 0)}{" (ongoing)" if d.ongoing else ""}</td>'
            f'<td data-field="resumed-from">{escape(where_resumed(d.resume_step, d.resume_tier)) or "–"}</td></tr>\n')


@register.simple_tag
def downtime_rows(downtimes: list) -> SafeString:
    """The <tr> of each interruption of `respawn_server.jobs.money.downtime.job_downtime`."""
    return mark_safe("".join(_downtime_row(d) for d in downtimes))  # noqa: S308 (the kind escaped, the rest numbers)
