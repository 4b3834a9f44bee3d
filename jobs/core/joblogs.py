"""Reading a job's trainer output across its instances, for `logs --follow`; each line
says whether it is the agent's own (protocol.AGENT_LINE_PREFIX) or the trainer's.

The cursor is per instance ("<instance id>:<next line offset>,..."): each agent
sends its chunks one after another, so within an instance nothing can commit
behind a reader's back, whereas a single global row id could (two gang members'
inserts commit out of id order)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from respawn.protocol import AGENT_LINE_PREFIX
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Job, LogChunk

MAX_CHUNKS_PER_READ = 200
CURSOR_PART = re.compile(r"(\d{1,19}):(\d{1,19})", re.ASCII)  # ASCII: str.isdigit() takes '²', int() does not
MAX_BIGINT = 2**63 - 1


class BadCursor(ValueError):
    pass


@dataclass
class LogPage:
    lines: list[dict]
    next: str
    more: bool  # another read would return more lines right away
    job_status: str
    finished: bool  # the job has ended and every line it sent has been returned


def parse_cursor(text: str) -> dict[int, int]:
    cursor = {}
    for part in filter(None, text.split(",")):
        match = CURSOR_PART.fullmatch(part)
        # Both numbers are compared with 64-bit columns: a bigger one is no cursor we gave out.
        if not match or max(int(match[1]), int(match[2])) > MAX_BIGINT:
            raise BadCursor(f"'after' must be the 'next' value of an earlier answer, like '12:340,13:0'; got {text!r}")
        cursor[int(match[1])] = int(match[2])
    return cursor


def format_cursor(cursor: dict[int, int]) -> str:
    return ",".join(f"{instance}:{offset}" for instance, offset in sorted(cursor.items()))


def read_job_logs(job: Job, after: str = "") -> LogPage:
    cursor = parse_cursor(after)
    # Status first: an agent's logs are delivered before its exit report, so once
    # the job is seen ended, the chunks read next include every line it sent.
    job_status = Job.objects.values_list("status", flat=True).get(pk=job.pk)
    unread = LogChunk.objects.filter(instance__job=job)
    for instance_id, offset in cursor.items():
        unread = unread.exclude(instance_id=instance_id, offset__lt=offset)
    ordered = unread.select_related("instance").order_by("instance__requested_at", "instance_id", "offset")
    chunks = list(ordered[: MAX_CHUNKS_PER_READ + 1])
    more = len(chunks) > MAX_CHUNKS_PER_READ
    lines = []
    for chunk in chunks[:MAX_CHUNKS_PER_READ]:
        for i, text in enumerate(chunk.lines):
            lines.append({"instance": chunk.instance_id, "rank": chunk.instance.rank, "offset": chunk.offset + i,
                          "line": text, "agent": text.startswith(AGENT_LINE_PREFIX)})
        end = chunk.offset + len(chunk.lines)
        cursor[chunk.instance_id] = max(cursor.get(chunk.instance_id, 0), end)
    finished = job_status in JobStatus.TERMINAL and not more
    return LogPage(lines, format_cursor(cursor), more, job_status, finished)
