"""respawn_server.jobs.money.costs against the hand-computed history in tests/costs/history.py."""

import datetime as dt
from decimal import Decimal

import pytest

from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.money import costs
from tests.costs.history import T, checkpoint, heartbeats, launched, make_history, seed_prices
from tests.factories import make_job, make_team_with_members

NOW = T(11, 29, 12)
D = Decimal


@pytest.fixture
def history(db):
    setup = make_team_with_members()
    job, a, b, never = make_history(setup.team, setup.people["member"].user)
    return setup, job, a, b, never


def test_it_prices_a_job_across_a_price_change_and_a_month_boundary(history):
    _, job, a, b, never = history
    cost = costs.job_cost(job, NOW)
    assert cost.ledger.spent == D("1.80")
    assert cost.ledger.baseline == D("2.33333333")
    assert cost.ledger.savings == D("0.53333333")
    spent = {int(i.instance_id): i.spent for i in cost.ledger.instances}
    assert spent == {a.pk: D("1.08"), b.pk: D("0.72")}
    assert never.pk not in cost.work, "an instance that never got a VM is not billed"


def test_it_keeps_work_along_the_checkpoints_resumed_from(history):
    _, job, a, b, _ = history
    work = costs.job_cost(job, NOW).work
    assert (work[a.pk].steps_kept, work[a.pk].recomputed_steps) == (900, 0)
    assert (work[b.pk].steps_kept, work[b.pk].recomputed_steps) == (600, 100)
    assert (work[a.pk].seconds_per_step, work[b.pk].seconds_per_step) == (D(6), D(5))


def test_it_splits_waste_into_recomputed_boot_and_stalls(history):
    _, job, a, b, _ = history
    cost = costs.job_cost(job, NOW)
    waste = cost.ledger.waste
    assert waste.boot_restore == D("0.15")
    assert waste.checkpoint_stalls == D("0.0015")
    assert waste.recomputed == D("0.10")
    assert cost.work[a.pk].boot_restore_seconds == D(600)
    assert cost.work[a.pk].checkpoint_stall_seconds == D(10)


def test_it_reports_each_utc_month(history):
    _, job, *_ = history
    months = costs.job_cost(job, NOW).ledger.by_month
    assert (months["2026-02"].spent, months["2026-02"].baseline) == (D("0.36"), D("0.75"))
    assert (months["2026-03"].spent, months["2026-03"].baseline) == (D("1.44"), D("1.58333333"))


def test_team_month_counts_only_that_month_and_that_team(history):
    setup, *_ = history
    make_job(setup.other_team, setup.people["outsider"].user)  # nothing of it may show up
    march = costs.team_month_cost(setup.team, "2026-03", NOW)
    assert (march.spent, march.baseline, march.savings) == (D("1.44"), D("1.58333333"), D("0.14333333"))
    assert march.gpu_hours == D("2.00")
    assert march.budget == D(1000)
    february = costs.team_month_cost(setup.team, "2026-02", NOW)
    assert february.spent == D("0.36") and february.gpu_hours == D("1.00")
    assert costs.team_month_cost(setup.other_team, "2026-03", NOW).spent == 0


def test_a_running_instance_is_billed_up_to_now(db):
    setup = make_team_with_members()
    seed_prices()
    job = make_job(setup.team, setup.people["member"].user)
    running = launched(job, at=T(3, 2, 10), state=InstanceState.RUNNING, last_step=50)
    heartbeats(running, [(T(3, 2, 10, 1), 0), (T(3, 2, 10, 2), 10), (T(3, 2, 10, 6), 50)])
    cost = costs.job_cost(job, now=T(3, 2, 10, 30))
    assert cost.ledger.spent == D("0.36")  # half an hour at 0.72
    assert cost.work[running.pk].steps_kept == 50
    assert cost.ledger.baseline == (D(50 * 6) / 3600).quantize(D("0.00000001"))  # 300 s at 1.00 $/h


def test_a_relaunch_on_another_type_is_priced_machine_by_machine(history):
    setup, job, a, b, _ = history
    from respawn_server.jobs.models import PriceQuote

    PriceQuote.objects.create(provider="aws", region="hand-1", zone="", instance_type="hand.gpu4",
                              market="on_demand", usd_per_hour=D("3.06"), observed_at=T(1, 1))
    c = launched(job, at=T(3, 1, 4), ended=T(3, 1, 5), end_reason="completed", last_step=1600, resume=None,
                 market="on_demand")
    from respawn_server.jobs.models import Instance

    Instance.objects.filter(pk=c.pk).update(instance_type="hand.gpu4")
    heartbeats(c, [(T(3, 1, 4, 1), 1500), (T(3, 1, 4, 2), 1510), (T(3, 1, 4, 11), 1600)])
    from respawn_server.jobs.models import Checkpoint

    Instance.objects.filter(pk=c.pk).update(resume_checkpoint=Checkpoint.objects.create(
        checkpoint_id="00000000-0000-4000-8000-0000000000cc", job=job, instance=b, step=1500, uri="/c", bytes=1,
        manifest_digest="d", committed_at=T(3, 1, 3)))
    cost = costs.job_cost(job, NOW)
    assert cost.work[c.pk].steps_kept == 100 and cost.work[c.pk].seconds_per_step == D(6)
    spent_c = {int(i.instance_id): i for i in cost.ledger.instances}[c.pk]
    assert spent_c.spent == D("3.06")  # one hour on-demand p3
    assert spent_c.baseline == D("0.51")  # 600 s × 3.06 / 3600


def test_a_month_that_is_not_yyyy_mm_is_refused_by_name(db):
    with pytest.raises(costs.CostError, match="month must look like YYYY-MM"):
        costs.parse_month("2026-13", NOW)
    with pytest.raises(costs.CostError, match="month"):
        costs.parse_month("march", NOW)


def test_a_billed_second_without_a_price_is_an_error_naming_the_instance(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user)
    instance = launched(job, at=T(3, 2, 10), ended=T(3, 2, 11), end_reason="completed")
    with pytest.raises(costs.CostError, match=f"instance {instance.pk}: no spot price"):
        costs.job_cost(job, NOW)


def test_queries_do_not_grow_with_jobs(history, django_assert_max_num_queries):
    setup, job, *_ = history
    more = [make_history_job(setup) for _ in range(3)]
    with django_assert_max_num_queries(7):  # instances, launches, heartbeats, stalls, regroups, drills, quotes
        answers = costs.job_costs([job.pk, *more], NOW)
    assert len(answers) == 4


def make_history_job(setup):
    job = make_job(setup.team, setup.people["member"].user)
    instance = launched(job, at=T(3, 5, 1), ended=T(3, 5, 2), end_reason="completed", last_step=10)
    heartbeats(instance, [(T(3, 5, 1, 1), 0), (T(3, 5, 1, 2), 10)])
    return job.pk


def test_month_edges_are_utc():
    label, start, end = costs.parse_month("2026-12", NOW)
    assert (label, start, end) == ("2026-12", T(12, 1), dt.datetime(2027, 1, 1, tzinfo=dt.UTC))
    assert costs.parse_month(None, NOW)[0] == "2026-11"


def test_interruptions_are_counted_once_per_instance_and_kind(history):
    setup, job, a, b, never = history
    from respawn_server.jobs.models import InterruptionEvent

    InterruptionEvent.objects.create(instance=a, kind="notice", source="aws_imds")  # announced a's preemption
    InterruptionEvent.objects.create(instance=b, kind="notice", source="aws_imds")  # a notice b outlived
    InterruptionEvent.objects.filter(kind="notice").update(received_at=T(3, 1, 0, 59))
    InterruptionEvent.objects.create(instance=never, kind="capacity_error", source="provider_api")
    InterruptionEvent.objects.filter(instance=never).update(received_at=T(3, 1, 1, 30))
    rows = costs.interruptions_by_placement(setup.team, "2026-03", NOW)
    # A notice and the preemption it announced are one interruption.
    assert [(r["zone"], r["kind_name"], r["count"]) for r in rows] == [
        ("hand-1a", "capacity_error", 1), ("hand-1a", "notice", 1), ("hand-1a", "preempted", 1)]
    assert costs.interruptions_by_placement(setup.team, "2026-04", NOW) == []


def test_a_teams_month_is_the_sum_of_its_jobs_months(history):
    setup, job, a, b, _ = history
    second = make_job(setup.team, setup.people["member"].user, accelerator_count=2)
    c = launched(second, at=T(3, 2, 10), ended=T(3, 2, 11, 30), end_reason="completed", last_step=30)
    heartbeats(c, [(T(3, 2, 10, 1), 0), (T(3, 2, 10, 31), 30)])
    march = costs.team_month_cost(setup.team, "2026-03", NOW)
    months = [costs.job_cost(j, NOW).ledger.by_month["2026-03"] for j in (job, second)]
    assert (march.spent, march.baseline, march.waste) == tuple(
        sum((getattr(m, part) for m in months), D(0)) for part in ("spent", "baseline", "waste"))
    assert march.spent == D("1.44") + D("1.08")  # 1.5 h more at 0.72
    assert march.gpu_hours == D("2.00") + D("3.00") and march.jobs == 2  # 1.5 h on two GPUs


def test_one_unpriceable_job_does_not_hide_the_others(history):
    setup, job, *_ = history
    stray = make_job(setup.team, setup.people["member"].user)
    unpriced = launched(stray, at=T(3, 2, 10), ended=T(3, 2, 11), end_reason="completed")
    from respawn_server.jobs.models import Instance

    Instance.objects.filter(pk=unpriced.pk).update(instance_type="no.such.type")
    answers = costs.job_costs_or_errors([job.pk, stray.pk], NOW)
    assert answers[job.pk].ledger.spent == D("1.80")
    assert isinstance(answers[stray.pk], costs.CostError) and "no spot price" in str(answers[stray.pk])
    with pytest.raises(costs.CostError, match=f"team {setup.team.pk}: job {stray.pk}: instance"):
        costs.team_month_cost(setup.team, "2026-03", NOW)


def test_settled_keys_follow_what_settled_money_depends_on(history):
    setup, job, a, b, _ = history
    from respawn_server.jobs.models import PriceQuote

    before = costs.settled_keys([job.pk])[job.pk]
    assert before is not None
    checkpoint(b, 1400, at=T(3, 1, 2, 59), stall_s=1.0)  # a fenced instance's late report
    late = costs.settled_keys([job.pk])[job.pk]
    PriceQuote.objects.create(provider="aws", region="hand-1", zone="hand-1a", instance_type="hand.gpu1",
                              market="spot", usd_per_hour=D("0.5"), observed_at=T(2, 1))
    backfilled = costs.settled_keys([job.pk])[job.pk]
    running = launched(job, at=T(3, 3, 1), last_step=1500)
    assert len({before, late, backfilled}) == 3
    assert costs.settled_keys([job.pk])[job.pk] is None, "a live instance's money grows: nothing to keep"
    from respawn_server.jobs.models import Instance

    Instance.objects.filter(pk=running.pk).update(state="ended", ended_at=T(3, 3, 2), end_reason="completed")
    assert costs.settled_keys([job.pk])[job.pk] not in (None, before, late, backfilled)
    ended = costs.settled_keys([job.pk])[job.pk]
    Instance.objects.filter(pk=a.pk).update(stopped_disk_sku="P10 LRS")  # a's evicted VM kept its disk
    assert costs.settled_keys([job.pk])[job.pk] is None, "a stopped disk's money grows until it is released"
    Instance.objects.filter(pk=a.pk).update(storage_released_at=T(3, 1, 4))
    released = costs.settled_keys([job.pk])[job.pk]
    from respawn_server.jobs.models import DiskPriceQuote

    DiskPriceQuote.objects.create(provider="aws", region="hand-1", sku="P10 LRS", usd_per_month=D("73"),
                                  observed_at=T(1, 1))
    assert len({ended, released, costs.settled_keys([job.pk])[job.pk], None}) == 4


def test_gpu_hours_count_no_gpu_for_a_job_on_cpu_vms(db):
    from tests.factories import make_instance

    setup = make_team_with_members()
    owner = setup.people["member"].user
    on_cpu = make_job(setup.team, owner, name="demo", accelerator_count=1)  # asks for a GPU, as jobs do by default
    make_instance(on_cpu, provider="local", region="local", zone="local-a", instance_type="cpu-small")
    on_gpu = make_job(setup.team, owner, name="gpu", accelerator_count=2)
    make_instance(on_gpu, provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge")
    jobs = costs.month_jobs(setup.team, dt.datetime.min.replace(tzinfo=dt.UTC), NOW + dt.timedelta(days=3650))
    assert costs.accelerators_by_job(jobs) == {on_cpu.pk: 0, on_gpu.pk: 2}
