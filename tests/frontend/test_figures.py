"""What the pages show equals what the API answers, and cached money never goes stale."""

from decimal import Decimal

from django.test import Client

from respawn_server.frontend.selectors import display_money
from respawn_server.jobs.models import PriceQuote
from tests.api.clients import client_for
from tests.costs.history import T, heartbeats, launched, make_history
from tests.factories import make_team_with_members


def signed_in(person):
    client = Client()
    client.force_login(person.user)
    return client


def api_cost(person, job):
    return client_for(person).get(f"/api/v1/jobs/{job.pk}/cost/").json()


def test_the_jobs_list_and_the_job_page_show_the_apis_money(db):
    setup = make_team_with_members()
    member = setup.people["member"]
    job, *_ = make_history(setup.team, member.user)
    api = api_cost(member, job)
    row = signed_in(member).get("/jobs.json").json()["rows"][0]
    assert (row["spent"], row["savings"]) == (api["spent"], api["savings"])
    assert (row["spent_display"], row["savings_display"]) == ("$1.80", "$0.53 (23%)")  # of $2.33 on-demand
    status = signed_in(member).get(f"/jobs/{job.pk}/status.json").json()
    assert status["money"]["savings"] == api["savings"]
    assert status["cost_curve"][-1]["spent"] == float(Decimal(api["spent"]))


def test_settled_money_follows_a_new_instance_and_a_backfilled_quote(db):
    setup = make_team_with_members()
    member = setup.people["member"]
    job, a, b, _ = make_history(setup.team, member.user)
    client = signed_in(member)
    assert client.get("/jobs.json").json()["rows"][0]["spent"] == "1.80000000"

    c = launched(job, at=T(3, 1, 4), ended=T(3, 1, 5), end_reason="completed", last_step=1500)
    heartbeats(c, [(T(3, 1, 4, 1), 1500), (T(3, 1, 4, 2), 1500)])
    assert client.get("/jobs.json").json()["rows"][0]["spent"] == "2.52000000"  # one more hour at 0.72

    PriceQuote.objects.create(provider="aws", region="hand-1", zone="hand-1a", instance_type="hand.gpu1",
                              market="spot", usd_per_hour=Decimal("0.36"), observed_at=T(3, 1, 4))
    assert client.get("/jobs.json").json()["rows"][0]["spent"] == "2.16000000"  # that hour now at 0.36


def test_the_team_overview_shows_the_months_figures(db):
    setup = make_team_with_members()
    make_history(setup.team, setup.people["member"].user)
    data = signed_in(setup.people["viewer"]).get(f"/teams/{setup.team.pk}/status.json?month=2026-03").json()
    assert (data["money"]["spent"], data["money"]["savings_display"], data["money"]["gpu_hours"]) == \
        ("1.44000000", "$0.14 (9%)", "2.00")  # of March's $1.58 on-demand
    assert [(r["kind_name"], r["count"]) for r in data["interruptions"]] == [("preempted", 1)]


def test_money_is_shown_to_the_cent_and_a_fraction_of_a_cent_as_such():
    assert display_money("-1.005") == "-$1.01"
    assert display_money("1234.5") == "$1,234.50"
    assert display_money("0.00432") == "$0.004"  # seconds of a cheap VM: not "$0.00"
    assert display_money("-0.00041") == "-$0.0004"
    assert display_money("0.00963") == "$0.01"
    assert display_money("0") == display_money("-0.00000000") == "$0.00"


def test_a_late_checkpoint_of_an_ended_instance_moves_the_settled_figure(db):
    from tests.costs.history import checkpoint

    setup = make_team_with_members()
    member = setup.people["member"]
    job, a, b, _ = make_history(setup.team, member.user)
    client = signed_in(member)
    before = client.get(f"/jobs/{job.pk}/status.json").json()["money"]["detail"]["waste"]["checkpoint_stalls"]
    checkpoint(b, 1400, at=T(3, 1, 2, 59), stall_s=36.0)  # reported in the fencing grace window
    after = client.get(f"/jobs/{job.pk}/status.json").json()["money"]["detail"]["waste"]["checkpoint_stalls"]
    assert (before, after) == ("0.00150000", "0.00870000")  # + 36 s at 0.72 $/h


def test_spent_and_saved_add_up_to_on_demand_as_shown_however_small_the_figures():
    import random

    from respawn.vocabulary.money import money_figures

    def amount(text: str) -> Decimal:
        return Decimal(text.split(" ")[0].replace("$", "").replace(",", ""))

    # The job: "spent $0.005 / on-demand $0.01 / savings $0.01 (56 %)".
    assert money_figures("0.0046", "0.0058", "0.0104") == {
        "spent": "$0.0046", "on_demand_baseline": "$0.0104", "savings": "$0.0058 (56%)"}
    rng = random.Random(34)
    for _ in range(2000):
        spent = Decimal(rng.randrange(0, 10 ** rng.randrange(1, 12))).scaleb(-8)
        baseline = Decimal(rng.randrange(0, 10 ** rng.randrange(1, 12))).scaleb(-8)
        shown = money_figures(spent, baseline - spent, baseline)
        assert amount(shown["spent"]) + amount(shown["savings"]) == amount(shown["on_demand_baseline"]), shown
        assert abs(amount(shown["spent"]) - spent) <= max(Decimal("0.005"), spent / 10), (spent, shown)


def test_the_artifact_path_is_shown_whole_with_a_button_that_copies_it(db):
    import re

    from tests.factories import make_job

    setup = make_team_with_members()
    member = setup.people["member"]
    uri = "file:///var/lib/respawn/checkpoints/team-vision/job-0042/export/step-00004500/model.safetensors"
    job = make_job(setup.team, member.user, artifact_uri=uri, artifact_digest="sha256:" + "ab" * 32)
    html = signed_in(member).get(f"/jobs/{job.pk}/").content.decode()
    shown = re.search(r'<code data-field="artifact" id="artifact-uri">([^<]*)</code>', html)
    assert shown and shown[1] == uri  # the whole of it, nothing cut
    assert '<button type="button" class="copy" data-copies="artifact-uri">Copy path</button>' in html
