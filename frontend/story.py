"""What the job page says in words and marks on its loss curve: why the checkpoint
interval is what it is, and where the job was preempted and where it resumed."""

from __future__ import annotations

from respawn.notices.base import notice_budget_s
from respawn_server.jobs.core.choices import EndReason

INTERRUPTED = (EndReason.PREEMPTED, EndReason.LOST)
SOURCES = {
    "young_daly": "Young/Daly, in Daly's higher-order form",
    "minimum": "the shortest allowed; Young/Daly gave {}",
    "maximum": "the longest allowed; Young/Daly gave {}",
    "override": "the job's own interval; Young/Daly would give {}",
}


def where_resumed(step: int | None, tier: str) -> str:
    """Where a node's work went on from after an interruption or regroup: "step 42 (memory
    tier)", "step 30 (storage)" or "the start" (no checkpoint); "" where nothing resumed (yet)."""
    if step is None:
        return ""
    if not tier:
        return "the start"
    return f"step {step} ({'memory tier' if tier == 'memory' else 'storage'})"


def duration_words(seconds: float | None) -> str:
    """`seconds` as a person says it: "3 s", "0.4 s", "4 min 10 s", "2.1 h", "3.5 days"."""
    if seconds is None:
        return "unbounded"
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 3600:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes} min {secs} s" if minutes and secs else f"{minutes} min" if minutes else f"{secs} s"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def interval_words(interval: dict, where: dict) -> str:
    """The checkpoint interval (`Instance.checkpoint_interval`, a stored IntervalDecision)
    and why, for the instance it was given to (`where`: its market, zone or region), e.g.
    "every 4 min 10 s: measured save cost 3 s, mean time between interruptions without a
    notice ~2.1 h on spot in us-east-1a (Young/Daly, in Daly's higher-order form)"."""
    place = f"{where['market'].replace('_', '-')} in {where['zone'] or where['region']}"
    mtbi = interval["unnoticed_mtbi_s"]
    interruptions = (f"mean time between interruptions without a notice ~{duration_words(mtbi)} on {place}"
                     if mtbi is not None else f"no interruption without a notice expected on {place}")
    every = interval.get("mtbi_s")  # absent from intervals stored before it was
    if every is not None and (mtbi is None or mtbi > 2 * every):
        # VMs reclaimed every 2 minutes with a notice: saying only "~234 days" would contradict them.
        interruptions = (f"interrupted every ~{duration_words(every)} on {place}, mostly with a notice a save "
                         f"meets; " + (f"without one ~{duration_words(mtbi)}" if mtbi is not None
                                      else "none without one expected"))
    why = SOURCES.get(interval["source"], interval["source"]).format(duration_words(interval["young_daly_s"]))
    return (f"every {duration_words(interval['seconds'])}: measured save cost "
            f"{duration_words(interval['checkpoint_cost_s'])}, {interruptions} ({why})")


CLOUD_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure", "local": "The local spot simulator"}


def save_fit_warning(fit: dict | None) -> str | None:
    """A warning when the newest periodic save (`reads.save_fit`) would not fit the
    budget its cloud's notice leaves, e.g. "Last save took 41 s; GCP gives 30 s notice
    (25 s to save): ..."; None when it fits or nothing says."""
    if fit is None or fit["persist_s"] <= notice_budget_s(fit["notice_window_s"]):
        return None
    cloud = CLOUD_NAMES.get(fit["provider"], fit["provider"])
    return (f"Last save took {duration_words(fit['persist_s'])}; {cloud} gives {duration_words(fit['notice_window_s'])} "
            f"notice ({duration_words(notice_budget_s(fit['notice_window_s']))} to save): a notice save of this state "
            "would not commit in time, and the job would resume from its previous checkpoint. "
            "A smaller state or faster checkpoint storage fixes it.")


def loss_marks(instances: list[dict]) -> list[dict]:
    """Where the loss curve is marked, by step: each resume (the step of the checkpoint
    the instance resumed from) and each preemption or loss (the last step the instance
    reported). `instances`: rows of `reads.curve_instances`, in launch order."""
    marks = []
    for row in instances:
        if row["resume_step"] is not None:
            marks.append({"kind": "resumed", "step": row["resume_step"], "instance": row["id"],
                          "text": f"#{row['id']} resumed from step {row['resume_step']} ({row['resume_validation']})"})
        if row["end_reason"] in INTERRUPTED:
            marks.append({"kind": row["end_reason"], "step": row["last_step"], "instance": row["id"],
                          "text": f"#{row['id']} {row['end_reason']} at step {row['last_step']}"})
    return marks
