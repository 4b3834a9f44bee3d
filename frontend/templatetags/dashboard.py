"""Rows of the jobs list, rendered in Python: 25 rows of twenty template variables
each were the largest cost of the list page. The markup is the one jobs.js builds
when it refreshes the rows in place. Texts people or machines wrote are escaped;
the rest is ours (ints, a reversed URL, formatted money and durations)."""

from html import escape

from django import template
from django.utils.safestring import SafeString, mark_safe

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
