"""What the job page tells without a browser: the interval in words, the loss curve
from every reported step with its resumes and preemptions, the log from its first
line in bounded answers, prices with spot beside on-demand, and a save too slow for
its cloud's notice."""

import datetime as dt
import uuid

import pytest
from django.test import Client

from respawn_server.frontend import selectors
from respawn_server.frontend.story import interval_words
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, LogChunk, MetricPoint, PriceQuote, StepPoint
from tests.factories import make_instance, make_job, make_team_with_members

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


@pytest.fixture
def setup(db):
    return make_team_with_members()


@pytest.fixture
def viewer(setup):
    client = Client()
    client.force_login(setup.people["viewer"].user)
    return client


@pytest.mark.parametrize(("interval", "where", "said"), [
    ({"seconds": 250.2, "source": "young_daly", "checkpoint_cost_s": 3.04, "unnoticed_mtbi_s": 7560.0,
      "young_daly_s": 250.2}, {"market": "spot", "zone": "us-east-1a", "region": "us-east-1"},
     "every 4 min 10 s: measured save cost 3 s, mean time between interruptions without a notice ~2.1 h on spot "
     "in us-east-1a (Young/Daly, in Daly's higher-order form)"),
    ({"seconds": 1200.0, "source": "maximum", "checkpoint_cost_s": 0.25, "unnoticed_mtbi_s": None,
      "young_daly_s": None}, {"market": "on_demand", "zone": "", "region": "eastus"},
     "every 20 min: measured save cost 0.2 s, no interruption without a notice expected on on-demand in eastus "
     "(the longest allowed; Young/Daly gave unbounded)"),
    ({"seconds": 300.0, "source": "override", "checkpoint_cost_s": 12.0, "unnoticed_mtbi_s": 19681817.0,
      "young_daly_s": 1200.0}, {"market": "spot", "zone": "b", "region": "r"},
     "every 5 min: measured save cost 12 s, mean time between interruptions without a notice ~227.8 days on spot "
     "in b (the job's own interval; Young/Daly would give 20 min)"),
    # The demo's market: every VM reclaimed after 2 minutes, each notice met by its save.
    ({"seconds": 60.0, "source": "minimum", "checkpoint_cost_s": 0.5, "unnoticed_mtbi_s": 20217600.0,
      "young_daly_s": 4500.0, "mtbi_s": 120.0}, {"market": "spot", "zone": "local-a", "region": "local"},
     "every 1 min: measured save cost 0.5 s, interrupted every ~2 min on spot in local-a, mostly with a notice a "
     "save meets; without one ~234.0 days (the shortest allowed; Young/Daly gave 1.2 h)"),
])
def test_the_interval_is_said_in_words(interval, where, said):
    assert interval_words(interval, where) == said


def test_the_loss_curve_has_every_reported_step_and_marks_resume_and_preemption(setup, viewer):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    first = make_instance(job, state=InstanceState.ENDED, end_reason=EndReason.PREEMPTED, last_step=130).instance
    checkpoint = Checkpoint.objects.create(job=job, instance=first, checkpoint_id=uuid.uuid4(), step=100,
                                           uri="/tmp/ckpt/step-100", bytes=1, manifest_digest="x",
                                           validation="valid", committed_at=T0)
    second = make_instance(job, state=InstanceState.RUNNING, resume_checkpoint=checkpoint).instance
    StepPoint.objects.bulk_create([StepPoint(job=job, instance=first, step=s, loss=1 / s, time=T0)
                                   for s in range(1, 131)])
    # Heartbeat points of an instance whose trainer reported its steps are not drawn twice...
    MetricPoint.objects.create(job=job, instance=first, step=50, loss=9.0, time=T0)
    # ...those of an instance that reported none (an older agent) are its curve.
    MetricPoint.objects.bulk_create([MetricPoint(job=job, instance=second, step=s, loss=0.5, time=T0)
                                     for s in (110, 120)])
    status = viewer.get(f"/jobs/{job.pk}/status.json").json()
    assert [p[0] for p in status["loss"]] == [*range(1, 131), 110, 120]
    assert {p[2] for p in status["loss"][:130]} == {first.pk} and 9.0 not in [p[1] for p in status["loss"]]
    assert [(m["kind"], m["step"]) for m in status["loss_marks"]] == [("preempted", 130), ("resumed", 100)]
    assert "valid" in status["loss_marks"][1]["text"]


def test_a_long_loss_curve_is_thinned_to_a_bounded_answer(setup, viewer):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    vm = make_instance(job, state=InstanceState.RUNNING).instance
    StepPoint.objects.bulk_create([StepPoint(job=job, instance=vm, step=s, loss=1.0, time=T0)
                                   for s in range(1, 3 * selectors.LOSS_POINTS + 1)])
    loss = viewer.get(f"/jobs/{job.pk}/status.json").json()["loss"]
    assert selectors.LOSS_POINTS // 2 <= len(loss) <= 2 * selectors.LOSS_POINTS
    assert [p[0] for p in loss] == sorted(p[0] for p in loss)


def test_the_log_is_read_from_its_first_line_in_bounded_answers(setup, viewer, monkeypatch):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    other = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    vm, elsewhere = make_instance(job).instance, make_instance(other).instance
    LogChunk.objects.create(instance=elsewhere, offset=0, lines=["not this job's"])
    for n in range(5):
        LogChunk.objects.create(instance=vm, offset=2 * n, lines=[f"line {2 * n}", f"line {2 * n + 1}"])
    monkeypatch.setattr(selectors, "LOG_CHUNKS", 2)
    lines, after, answers = [], 0, 0
    while True:
        answer = viewer.get(f"/jobs/{job.pk}/log.json?after={after}").json()
        lines += answer["lines"]
        after, answers = answer["next"], answers + 1
        if not answer["more"]:
            break
    assert lines == [f"[{vm.pk}] line {n}" for n in range(10)] and answers == 3
    assert viewer.get(f"/jobs/{job.pk}/log.json?after={after}").json() == {"lines": [], "next": after, "more": False}


@pytest.mark.parametrize("after", ["-1", "x", "²", str(2**63), "1.5"])
def test_a_bad_log_cursor_is_a_400_naming_after(setup, viewer, after):
    job = make_job(setup.team, setup.people["member"].user)
    response = viewer.get(f"/jobs/{job.pk}/log.json", {"after": after})
    assert response.status_code == 400 and "after" in response.json()["errors"]


def test_another_teams_log_is_not_found(setup, db):
    job = make_job(setup.team, setup.people["member"].user)
    outsider = Client()
    outsider.force_login(setup.people["outsider"].user)
    assert outsider.get(f"/jobs/{job.pk}/log.json").status_code in (403, 404)


def test_prices_put_spot_beside_on_demand_launchable_clouds_first(setup, viewer, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["gcp"]}
    for provider, region, zone, market, usd in [
            ("aws", "r1", "", "on_demand", "1.0000"), ("aws", "r1", "r1a", "spot", "0.3000"),
            ("gcp", "g1", "g1-a", "spot", "0.2500"), ("gcp", "g1", "", "on_demand", "1.0000"),
            ("gcp", "g1", "g1-b", "spot", "0.5000")]:
        PriceQuote.objects.create(provider=provider, region=region, zone=zone, instance_type="t.gpu", market=market,
                                  usd_per_hour=usd, observed_at=T0)
    page = viewer.get("/prices/?type=t.gpu").content.decode()
    rows = [row for row in page.split("<tr ")[1:] if row.startswith("data-launchable")]
    assert [(r.split('data-cloud="')[1].split('"')[0], 'data-launchable="yes"' in r) for r in rows] == [
        ("gcp", True), ("gcp", True), ("aws", False)]
    assert '<td class="num" data-field="discount">75%</td>' in rows[0] and 'data-field="on-demand">1.0' in rows[0]
    assert '<td class="num" data-field="discount">50%</td>' in rows[1]
    assert '<td class="num" data-field="discount">70%</td>' in rows[2]


# The warning, before any notice, that the newest periodic save would not fit the
# budget its cloud's notice leaves (issue 19, item 5).
def saved(job, instance, step: int, *, persist_s: float | None, window_s: float | None, kind: str = "periodic"):
    Checkpoint.objects.create(job=job, instance=instance, checkpoint_id=uuid.uuid4(), step=step, uri=f"/tmp/ckpt/step-{step}",
                              bytes=1, manifest_digest="x", kind=kind, committed_at=T0 + dt.timedelta(minutes=step),
                              save_s=(persist_s or 0) + 300, persist_s=persist_s, notice_window_s=window_s)


def warning(viewer, job) -> str | None:
    html = viewer.get(f"/jobs/{job.pk}/").content.decode()
    if 'id="save-warning"' not in html:
        return None
    return html.split('id="save-warning" class="warning" role="alert">')[1].split("</p>")[0]


def test_a_save_slower_than_gcps_notice_is_warned_about_in_its_words(setup, viewer):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    instance = make_instance(job, state=InstanceState.RUNNING, provider="gcp").instance
    saved(job, instance, 10, persist_s=41.0, window_s=30.0)
    said = warning(viewer, job)
    assert said.startswith("Last save took 41 s; GCP gives 30 s notice (25 s to save)"), said


def test_a_save_that_fits_the_budget_and_one_that_says_nothing_give_no_warning(setup, viewer):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    instance = make_instance(job, state=InstanceState.RUNNING, provider="aws").instance
    saved(job, instance, 10, persist_s=41.0, window_s=30.0)
    saved(job, instance, 20, persist_s=100.0, window_s=120.0)  # AWS: 108 s to save, the newest fits
    saved(job, instance, 30, persist_s=500.0, window_s=None)  # a cloud whose notice is not known: nothing to say
    saved(job, instance, 40, persist_s=200.0, window_s=120.0, kind="notice")  # only periodic saves are measures
    assert warning(viewer, job) is None
    saved(job, instance, 50, persist_s=109.0, window_s=120.0)
    assert warning(viewer, job).startswith("Last save took 1 min 49 s; AWS gives 2 min notice (1 min 48 s to save)")
