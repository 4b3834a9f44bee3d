"""`respawn report`, run as a user would against a live control plane: the API's report as
tables, its CSV and its JSON, and a refused month named by its flag."""

import csv
import io
import json
import re

from tests.cli.test_cli_live import cli  # noqa: F401  (the fixture: the console script against a live server)
from tests.costs.history import make_history


def test_report_prints_the_months_and_jobs_and_gives_the_apis_csv_and_json(cli):  # noqa: F811
    job, *_ = make_history(cli.setup.team, cli.setup.people["member"].user)
    table = cli("report", "--from", "2026-01", "--to", "2026-06")
    assert table.returncode == 0, table.stderr
    assert re.search(r"(?m)^spent\s+\$1\.80$", table.stdout) and re.search(r"(?m)^saved\s+\$0\.53 \(23%\)$", table.stdout)
    assert re.search(r"(?m)^2026-03\s+\$1\.44\s", table.stdout)  # the month's share, as the team's month says
    assert re.search(rf"(?m)^{job.pk}\s+train-resnet\s", table.stdout) and "hand-1a" in table.stdout
    assert table.stdout.startswith(f"team {cli.setup.team.name}, ")  # its name, not its id

    as_csv = cli("report", "--team", cli.setup.team.name, "--from", "2026-01", "--to", "2026-06", "--format", "csv", "--table", "months")
    assert as_csv.returncode == 0, as_csv.stderr
    months = {row["month"]: row for row in csv.DictReader(io.StringIO(as_csv.stdout))}
    assert list(months) == [f"2026-{n:02d}" for n in range(1, 7)] and months["2026-02"]["spent"] == "0.36000000"

    as_json = json.loads(cli("report", "--from", "2026-01", "--to", "2026-06", "--json").stdout)
    assert as_json["jobs"][0]["job"] == job.pk and as_json["totals"]["on_demand_baseline"] == "2.33333333"


def test_a_bad_month_is_refused_naming_its_flag(cli):  # noqa: F811
    bad = cli("report", "--from", "2026-13")
    assert bad.returncode == 2 and "--from:" in bad.stderr and "YYYY-MM" in bad.stderr
    backwards = cli("report", "--from", "2026-06", "--to", "2026-01")
    assert backwards.returncode == 2 and "--from:" in backwards.stderr
    unknown = cli("report", "--format", "xml")
    assert unknown.returncode == 2 and "--format" in unknown.stderr  # argparse's own refusal
