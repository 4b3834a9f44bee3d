"""Rows of the jobs list, rendered in Python: 25 rows of twenty template variables
each were the largest cost of the list page, which is loaded on every visit. The
markup is the one jobs.js builds when it refreshes the rows in place."""

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

ROW = ('<tr data-job="{}">\n'
       '<td><a href="{}">{}</a></td>\n'
       '<td>{}</td>\n'
       '<td data-field="status"><span class="status s-{}">{}</span>{}</td>\n'
       '<td data-field="progress">{}{}</td>\n'
       '<td data-field="eta">{}</td>\n'
       '<td data-field="spent" class="num" data-exact="{}">{}</td>\n'
       '<td data-field="savings" class="num" data-exact="{}">{}</td>\n'
       '<td data-field="interruptions" class="num">{}</td>\n'
       '<td data-field="cloud">{}</td>\n'
       '</tr>\n')
EMPTY = mark_safe('<tr class="empty"><td colspan="9">No jobs match.</td></tr>')


def _cells(row: dict) -> tuple:
    reason = format_html('<span class="reason">{}</span>', row["status_reason"]) if row["status_reason"] else ""
    progress = format_html(' / {} <progress max="100" value="{}" aria-label="{}% done"></progress>',
                           row["total_steps"], row["progress_pct"], row["progress_pct"]) if row["total_steps"] else ""
    return (row["id"], row["url"], row["name"], row["owner"], row["status"], row["status"], reason,
            row["last_step"], progress, row["eta_display"], row["spent"] or "", row["spent_display"],
            row["savings"] or "", row["savings_display"], row["interruptions"], row["cloud"] or "–")


@register.simple_tag
def job_rows(rows: list[dict]) -> SafeString:
    """The <tr> of each row of `frontend.selectors.job_rows`."""
    return format_html_join("", ROW, (_cells(row) for row in rows)) if rows else EMPTY
