"""One function per subcommand: each takes the parsed arguments, talks to the
API, prints, and returns the exit code (failures raise CliError)."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import re
import socket
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from respawn.vocabulary.money import money_figures, usd
from respawn.cli import workdir
from respawn.cli.api import Api, FieldErrors
from respawn.cli.config import Credentials, load_credentials, save_credentials, server_url
from respawn.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, CliError
from respawn.cli.jobspec import InvalidSpec, JobSpec, load_job_spec
from respawn.cli.output import print_fields, print_json, print_json_line, print_table
from respawn.protocol import AGENT_LINE_PREFIX
from respawn.vocabulary.spec_text import env_problem

JOB_COLUMNS = [
    ("ID", "id"), ("NAME", "name"), ("TEAM", "team"), ("OWNER", "owner"), ("STATUS", "status"),
    ("NODES", "nodes"), ("STEP", lambda j: f"{j['last_step']}/{j['total_steps'] or '?'}"),
    ("PRIO", "priority"), ("CREATED", "created_at"), ("REASON", "status_reason"),
]
SOURCE_FIELDS = ("source_archive", "source_git_url", "source_git_commit")  # a job's code, besides --workdir
TOKEN_COLUMNS = [
    ("ID", "id"), ("NAME", "name"), ("PREFIX", "prefix"), ("CREATED", "created_at"), ("EXPIRES", "expires_at"),
    ("LAST USED", "last_used_at"), ("REVOKED", "revoked_at"), ("", lambda t: "(this one)" if t["current"] else ""),
]


def api(args) -> Api:
    return Api.signed_in(load_credentials(args.url, insecure_http=args.insecure_http))


# --- login ---

def login(args) -> int:
    url = server_url(args.url, insecure_http=args.insecure_http)
    if not url:
        raise CliError("which control plane? pass --url URL or set RESPAWN_URL", EXIT_BAD_INPUT)
    username = args.username or input("Username: ")
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass("Password: ")
    token_name = args.token_name or f"cli@{socket.gethostname()}"
    try:
        answer = Api(url).request("POST", "auth/token/",
                                  json={"username": username, "password": password, "token_name": token_name})
    except FieldErrors as e:
        raise CliError("login refused: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in e.errors.items()),
                       EXIT_BAD_INPUT) from e
    path = save_credentials(Credentials(url, answer["token"]))
    if args.json:
        print_json({"url": url, "username": username, "token_name": token_name, "credentials": str(path)})
    else:
        print(f"Logged in to {url} as {username}; token '{token_name}' saved in {path}")
    return EXIT_OK


# --- jobs ---

def resolve_team(client: Api, team, spec: JobSpec | None = None, teams: list[dict] | None = None) -> int:
    """A team id from a name or an id, checked against the teams you are in (`teams`, when
    the caller has listed them already)."""
    teams = client.all_pages("teams/") if teams is None else teams
    for t in teams:
        if str(team) in (str(t["id"]), t["name"]):
            return t["id"]
    where = f"{spec.where('team')}: field 'team': " if spec else ""
    names = ", ".join(t["name"] for t in teams) or "none"
    raise CliError(f"{where}you are in no team {team!r}; your teams: {names}", EXIT_BAD_INPUT)


def submit(args) -> int:
    try:
        spec = load_job_spec(Path(args.file))
    except InvalidSpec as e:
        raise CliError(f"{args.file} is not a valid job file; nothing was submitted", EXIT_BAD_INPUT, e.problems) from e
    secrets = _secret_env(args, spec)
    archive = _workdir_archive(args, spec)
    try:
        return _submit(args, spec, archive, secrets)
    finally:
        if archive is not None:
            archive.path.unlink(missing_ok=True)


def _workdir_archive(args, spec: JobSpec) -> workdir.Archive | None:
    """--workdir's archive, built (and checked against the size limit) before anything is sent."""
    if not args.workdir:
        return None
    named = [name for name in SOURCE_FIELDS if spec.body.get(name)]
    if named:
        raise CliError(f"{spec.where(named[0])}: field '{named[0]}' names the job's code, and so does --workdir: "
                       "give one of them; nothing was submitted", EXIT_BAD_INPUT)
    return workdir.build(Path(args.workdir), workdir.max_bytes())


def _secret_env(args, spec: JobSpec) -> dict[str, str]:
    """--secret NAME=value and --secret-from-env NAME, checked before anything is sent.
    No message holds a value."""
    secrets = {}
    for given in args.secret:
        name, sep, value = given.partition("=")
        if not sep or not name:
            raise CliError(f"--secret {name or '…'}: give NAME=value; nothing was submitted", EXIT_BAD_INPUT)
        secrets[name] = value
    for name in args.secret_from_env:
        if name not in os.environ:
            raise CliError(f"--secret-from-env {name}: no such variable in this shell; nothing was submitted",
                           EXIT_BAD_INPUT)
        secrets[name] = os.environ[name]
    problem = env_problem(secrets)
    if problem:
        raise CliError(f"--secret: {problem}; nothing was submitted", EXIT_BAD_INPUT)
    both = sorted(set(secrets) & set(spec.body.get("env") or {}))
    if both:
        raise CliError(f"--secret {', '.join(both)}: also in the job file's env, name each once; nothing was "
                       "submitted", EXIT_BAD_INPUT)
    return secrets


def _submit(args, spec: JobSpec, archive: workdir.Archive | None, secrets: dict[str, str]) -> int:
    body = dict(spec.body)
    if secrets:
        body["secret_env"] = dict.fromkeys(secrets)  # names only until sent: --dry-run prints the body
    if archive is not None:
        body["source_archive"] = archive.digest
    if args.dry_run:
        shipped = (f"; --workdir: {archive.files} files, {archive.bytes} bytes as {archive.digest}"
                   if archive is not None else "")
        print_json(body) if args.json else print(f"{args.file} is a valid job file{shipped} "
                                                 "(not submitted: --dry-run)")
        return EXIT_OK
    client = api(args)
    if secrets:
        body["secret_env"] = secrets
    body["team"] = resolve_team(client, spec.body["team"], spec)
    if archive is not None:
        workdir.ship(client, archive, body["team"])
    try:
        job = client.post("jobs/", body)
    except FieldErrors as e:
        problems = [f"{spec.where(name)}: field '{name}': {' '.join(map(str, msgs))}" for name, msgs in e.errors.items()]
        raise CliError(f"the server rejected {args.file}; nothing was submitted", EXIT_BAD_INPUT, problems) from e
    print_json(job) if args.json else print(f"submitted job {job['id']} '{job['name']}': {job['status']}")
    return EXIT_OK


def ls(args) -> int:
    client = api(args)
    teams = client.all_pages("teams/")
    team = resolve_team(client, args.team, teams=teams) if args.team else None
    page = client.get("jobs/", status=args.status, team=team, owner=args.owner, search=args.search, limit=args.limit)
    if args.json:
        print_json(page["results"])
        return EXIT_OK
    names = {t["id"]: t["name"] for t in teams}  # people read a team's name; the API gives its id
    rows = [{**job, "team": names.get(job["team"], job["team"])} for job in page["results"]]
    print_table(rows, JOB_COLUMNS, empty="no jobs match")
    if page["count"] > len(page["results"]):
        print(f"({len(page['results'])} of {page['count']} shown; raise --limit to see more)")
    return EXIT_OK


def show(args) -> int:
    job = api(args).get(f"jobs/{args.job}/")
    print_json(job) if args.json else print_fields(job)
    return EXIT_OK


def events(args) -> int:
    rows = api(args).all_pages(f"jobs/{args.job}/events/")
    if args.json:
        print_json(rows)
    else:
        print_table(rows, [("TIME", "created_at"), ("FROM", "from_status"), ("TO", "to_status"),
                           ("MESSAGE", "message")], empty="no events")
    return EXIT_OK


def cancel(args) -> int:
    client = api(args)
    try:
        job = client.post(f"jobs/{args.job}/cancel/")
    except CliError as e:
        if e.exit_code == EXIT_FAILED:  # 409: already finished
            raise CliError(f"job {args.job} cannot be cancelled: {e.message}") from e
        raise
    print_json(job) if args.json else print(f"job {job['id']}: {job['status']}")
    return EXIT_OK


DRILL_PHASES = [("notice seen", "notice_seen_after_s"), ("save committed", "save_committed_after_s"),
                ("replacement requested", "replacement_requested_after_s"),
                ("replacement booted", "replacement_booted_after_s"), ("validated", "validated_after_s"),
                ("training again", "training_again_after_s")]


def drill(args) -> int:
    """Ask for a drill (the control plane's worker interrupts the VM), or with --report show
    the job's drills: each phase in seconds after the interruption, and the verdict."""
    client = api(args)
    if args.report:
        drills = client.get(f"jobs/{args.job}/drills/")
        if args.json:
            print_json(drills)
        for one in [] if args.json else drills:
            print(drill_words(one))
        if not drills and not args.json:
            print(f"job {args.job} has had no drill")
        return EXIT_OK
    try:
        made = client.post(f"jobs/{args.job}/drill/", {"node": args.node, "without_notice": args.without_notice})
    except CliError as e:
        if e.exit_code == EXIT_FAILED:  # 409: nothing running to drill, or a drill in flight
            raise CliError(f"job {args.job} cannot be drilled now: {e.message}") from e
        raise
    if args.json:
        print_json(made)
    else:
        how = "with its cloud's notice" if made["with_notice"] else "without notice"
        print(f"drill {made['id']} of job {args.job}: node {made['rank']} is interrupted {how}; "
              f"`respawn drill {args.job} --report` shows how the recovery went")
    return EXIT_OK


def drill_words(one: dict) -> str:
    verdict = {True: "PASSED", False: "FAILED", None: one["status"]}[one["passed"]]
    lines = [f"drill {one['id']} (node {one['rank']}, {'with' if one['with_notice'] else 'without'} notice, by "
             f"{one['requested_by']}): {verdict}" + (f": {one['cause']}" if one["cause"] else "")]
    for label, key in DRILL_PHASES:
        if one[key] is not None:
            lines.append(f"  {label} after {one[key]:.1f} s")
    if one["steps_lost"] is not None:
        lines.append(f"  steps lost: {one['steps_lost']}")
    if one["window_s"] is not None:
        lines.append(f"  notice window: {one['window_s']:.0f} s")
    return "\n".join(lines)


def logs(args) -> int:
    """Print the job's output; with --follow keep reading until the job has ended,
    riding out dropped connections (for --retry-for seconds) from the last line printed."""
    client = api(args)

    def ask(path: str, **params):
        if args.follow:
            return client.patiently(lambda: client.get(path, **params), for_s=args.retry_for)
        return client.get(path, **params)

    job = ask(f"jobs/{args.job}/")
    gang = job["nodes"] > 1
    after, started, said = "", time.monotonic(), False
    while True:
        page = ask(f"jobs/{args.job}/logs/", after=after)
        trainer_printed = any(not line.get("agent") for line in page["lines"])
        if args.follow and not said and not trainer_printed and not page["more"] and not page["finished"] \
                and not args.json:
            # Silence, or only the agent's lines, would read as a hang: say what the job is doing.
            why = f" ({job['status_reason']})" if job.get("status_reason") else ""
            print(f"-- job {args.job} is {page['job_status']}{why}: the trainer has printed nothing yet; its output "
                  f"and the agent's own lines ({AGENT_LINE_PREFIX}) appear here as they come", file=sys.stderr, flush=True)
        said = said or trainer_printed or not page["more"]
        for line in page["lines"]:
            if args.json:
                print_json_line(line)
            else:
                print(f"[rank {line['rank']}] {line['line']}" if gang else line["line"])
        sys.stdout.flush()
        after = page["next"]
        if page["more"]:
            continue
        if page["finished"] or not args.follow:
            if args.follow and not args.json:
                print(f"-- job {args.job} {page['job_status']}", file=sys.stderr)
            return EXIT_OK
        if args.max_wait is not None and time.monotonic() - started >= args.max_wait:
            raise CliError(f"stopped following after {args.max_wait:g}s: job {args.job} is still {page['job_status']}")
        time.sleep(args.poll)


def cost(args) -> int:
    client = api(args)
    job = client.get(f"jobs/{args.job}/")  # a missing job is a 404 about the job, not about its cost
    answer = client.get(f"jobs/{args.job}/cost/")
    if args.json:
        print_json(answer)
        return EXIT_OK
    print(f"job {job['id']} '{job['name']}' ({job['status']}), as of {answer['as_of'][:19].replace('T', ' ')} UTC, "
          f"in US dollars (--json: exact)")
    shown = _figures(answer)
    print_fields({"spent": shown["spent"], "on-demand would cost": shown["on_demand_baseline"],
                  "savings": shown["savings"], "waste": usd(answer["waste"]["total"]), **_drill_fields(answer)})
    print()
    print_table(answer["instances"], [
        ("INSTANCE", "instance"), ("RANK", "rank"), ("FROM", "billed_from"), ("TO", "billed_to"),
        ("SECONDS", "billed_seconds"), ("SPENT", lambda i: _figures(i)["spent"]),
        ("ON-DEMAND", lambda i: _figures(i)["on_demand_baseline"]), ("SAVED", lambda i: _figures(i)["savings"]),
        ("STEPS KEPT", "steps_kept"), ("RECOMPUTED", "recomputed_steps"),
    ], empty="no billed instances yet")
    return EXIT_OK


def _drill_fields(answer: dict) -> dict[str, str]:
    """What drills spent, apart from spent and savings, and the bill with it; nothing for a
    job or team never drilled."""
    drills = answer.get("drills")  # a server before drills' money was shown apart has none
    if not drills or not Decimal(drills["total"]):
        return {}
    return {"spent on drills": f"{usd(drills['total'])} (lost work {usd(drills['lost_work'])}, replacement boot "
                               f"{usd(drills['replacement_boot'])}; not in spent or savings)",
            "billed in all": usd(answer["billed"])}


def flag_problems(refused: FieldErrors, flags: dict[str, str]) -> list[str]:
    """The server's field errors, each named by the flag that set its field (`flags`: field -> flag)."""
    return [f"{flags.get(field, field)}: {' '.join(_messages(said))}" for field, said in refused.errors.items()]


def _messages(said) -> list[str]:
    """A field's messages, also where DRF nests them (a list's items by index: {"0": [...]})."""
    if isinstance(said, dict):
        return [message for inner in said.values() for message in _messages(inner)]
    if isinstance(said, list):
        return [message for inner in said for message in _messages(inner)]
    return [str(said)]


# --- savings report ---

REPORT_SECTIONS = ("months", "jobs", "waste", "interruptions", "cumulative")  # the API's CSV tables
REPORT_FLAGS = {"from": "--from", "to": "--to", "table": "--table", "format": "--format"}  # API field -> flag


def _my_team(client: Api, team) -> dict:
    """`--team`, or the one team you are in: its row (id, name)."""
    teams = client.all_pages("teams/")
    if team is not None:
        found = resolve_team(client, team, teams=teams)
        return next(t for t in teams if t["id"] == found)
    if len(teams) != 1:
        names = ", ".join(t["name"] for t in teams) or "none"
        raise CliError(f"which team? pass --team NAME; your teams: {names}", EXIT_BAD_INPUT)
    return teams[0]


def report(args) -> int:
    client = api(args)
    fmt = "json" if args.json else args.format
    row = _my_team(client, args.team)
    team = row["id"]
    query = {"from": args.from_month, "to": args.to_month}
    try:
        if fmt == "csv":
            sys.stdout.write(client.get_text(f"teams/{team}/report/", format="csv", table=args.table or "jobs", **query))
            return EXIT_OK
        answer = client.get(f"teams/{team}/report/", **query)
    except FieldErrors as e:
        raise CliError("the report was refused", EXIT_BAD_INPUT, flag_problems(e, REPORT_FLAGS)) from e
    if fmt == "json":
        print_json(answer)
        return EXIT_OK
    _print_report({**answer, "team": row["name"]}, args.table)
    return EXIT_OK


def _figures(row: dict) -> dict[str, str]:
    """A row's spent, on-demand and saved as shown together: they add up as read."""
    return money_figures(row["spent"], row["savings"], row["on_demand_baseline"])


def _money_columns(prefix: list[tuple]) -> list[tuple]:
    return [*prefix, ("SPENT", lambda r: _figures(r)["spent"]), ("ON-DEMAND", lambda r: _figures(r)["on_demand_baseline"]),
            ("SAVED", lambda r: _figures(r)["savings"]), ("WASTED", lambda r: usd(r["waste"]))]


def _print_report(answer: dict, only: str | None) -> None:
    totals = answer["totals"]
    print(f"team {answer['team']}, {answer['from']} to {answer['to']} (UTC), as of {answer['as_of'][:19].replace('T', ' ')} UTC, "
          "in US dollars (--format json or csv: exact)")
    shown = _figures(totals)
    print_fields({"spent": shown["spent"], "on-demand for the same work": shown["on_demand_baseline"],
                  "saved": shown["savings"], "wasted": usd(totals["waste"]), **_drill_fields(totals),
                  "jobs": totals["jobs"]})
    for job in answer["unpriced"]:
        print(f"left out, cannot be priced: job {job['job']}: {job['error']}")
    months = [m for m in answer["months"] if m["jobs"]]  # a range's months without a job: rows of zeros
    tables = {
        "months": (months, _money_columns([("MONTH", "month")]) + [("JOBS", "jobs")]),
        "jobs": (answer["jobs"], _money_columns([("JOB", "job"), ("NAME", "name"), ("STATUS", "status"),
                                                 ("PREEMPTIONS", "preemptions")])
                 + [("DRILLS", lambda r: usd(r.get("drills", "0")))]),
        "waste": ([{"kind": k, "usd": v} for k, v in answer["waste"].items()], [("WASTE", "kind"), ("USD", lambda r: usd(r["usd"]))]),
        "interruptions": (answer["interruptions"], [("CLOUD", "cloud"), ("ZONE", "zone"), ("PREEMPTED", "preempted"),
                                                    ("LOST", "lost"), ("NOTICES", "notice"), ("CAPACITY", "capacity_error"),
                                                    ("TOTAL", "total")]),
        "cumulative": (answer["cumulative"], [("AT", "at"), ("SPENT", lambda p: f"{p['spent']:.2f}"),
                                              ("ON-DEMAND", lambda p: f"{p['on_demand']:.2f}"),
                                              ("SAVED", lambda p: f"{p['savings']:.2f}")]),
    }
    for name in [only] if only else REPORT_SECTIONS[:-1]:  # the curve's points only when asked for
        rows, columns = tables[name]
        print(f"\n{name}:")
        print_table(rows, columns, empty=f"no {name} in these months")


# --- tokens ---

DURATION_RE = re.compile(r"^(\d+)([hdw])$")
DURATION_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_expiry(args) -> str | None:
    if args.expires_in:
        match = DURATION_RE.match(args.expires_in)
        if not match:
            raise CliError(f"--expires-in {args.expires_in!r}: use a number and h, d or w, e.g. 12h, 30d, 8w",
                           EXIT_BAD_INPUT)
        delta = dt.timedelta(**{DURATION_UNITS[match[2]]: int(match[1])})
        return (dt.datetime.now(dt.timezone.utc) + delta).isoformat()
    return args.expires


def tokens(args) -> int:
    client = api(args)
    if args.tokens_command == "create":
        try:
            token = client.post("tokens/", {"name": args.name, "expires_at": parse_expiry(args)})
        except FieldErrors as e:
            raise CliError("; ".join(f"{k}: {' '.join(v)}" for k, v in e.errors.items()), EXIT_BAD_INPUT) from e
        if args.json:
            print_json(token)
        else:
            print(f"token '{token['name']}' (id {token['id']}): {token['token']}")
            print("This is the only time it is shown: store it now (e.g. as RESPAWN_TOKEN).", file=sys.stderr)
    elif args.tokens_command == "revoke":
        token = client.post(f"tokens/{args.id}/revoke/")
        print_json(token) if args.json else print(f"token '{token['name']}' (id {token['id']}) revoked")
    else:
        rows = client.all_pages("tokens/")
        print_json(rows) if args.json else print_table(rows, TOKEN_COLUMNS, empty="no tokens")
    return EXIT_OK


# --- notifications ---

SUBSCRIPTION_COLUMNS = [
    ("ID", "id"), ("TEAM", "team"), ("NAME", "name"), ("FOR", lambda s: s["owner"] or "(team)"),
    ("CHANNEL", "channel"), ("TO", lambda s: s["url"] or s["email"]), ("EVENTS", "events"), ("ENABLED", "enabled"),
    ("FAILING", "failing_reason"),
]
ATTEMPT_COLUMNS = [
    ("DELIVERY", "id"), ("SUB", "subscription"), ("KIND", "kind"), ("JOB", "job"), ("STATUS", "status"),
    ("TRY", "try"), ("AT", "started_at"),
    ("SECONDS", lambda a: None if a.get("duration_s") is None else f"{a['duration_s']:.2f}"),
    ("CODE", "status_code"), ("ERROR", "error"),
]
NOTIFY_FLAGS = {"team": "--team", "scope": "--team-wide", "name": "--name", "channel": "--channel", "url": "--to",
                "email": "--email", "events": "--events"}


def notify(args) -> int:
    return NOTIFY_ACTIONS[args.notify_command or "list"](api(args), args)


def _notify_list(client: Api, args) -> int:
    team = resolve_team(client, args.team) if args.team else None
    rows = client.all_pages("subscriptions/", team=team)
    print_json(rows) if args.json else print_table(rows, SUBSCRIPTION_COLUMNS, empty="no subscriptions")
    return EXIT_OK


def _notify_add(client: Api, args) -> int:
    target = args.email or urlsplit(args.hook_url or "").hostname  # a Slack URL's path is its secret: not in the name
    body = {"team": _my_team(client, args.team)["id"], "scope": "team" if args.team_wide else "personal",
            "name": args.name or f"{args.channel}: {target or '?'}", "channel": args.channel, "events": args.events,
            "url": args.hook_url or "", "email": args.email or ""}
    try:
        created = client.post("subscriptions/", body)
    except FieldErrors as e:
        raise CliError("the server refused the subscription; nothing was made", EXIT_BAD_INPUT,
                       flag_problems(e, NOTIFY_FLAGS)) from e
    if args.json:
        print_json(created)
        return EXIT_OK
    print(f"subscription {created['id']} '{created['name']}': {created['channel']} for {', '.join(created['events'])}")
    if created["secret"]:
        print(f"signing secret: {created['secret']}")
        print("This is the only time the secret is shown: give it to the receiver now (it checks "
              "X-Respawn-Signature with it; see docs/notifications.md).", file=sys.stderr)
    return EXIT_OK


def _notify_test(client: Api, args) -> int:
    delivery = client.post(f"subscriptions/{args.id}/test/")
    if args.json:
        print_json(delivery)
    else:
        print(f"test message queued for subscription {args.id}: delivery {delivery['id']} ({delivery['status']}); "
              f"see `respawn notify deliveries --subscription {args.id}`")
    return EXIT_OK


def _notify_deliveries(client: Api, args) -> int:
    page = client.get("deliveries/", subscription=args.subscription, status=args.status, limit=args.limit)
    if args.json:
        print_json(page["results"])
        return EXIT_OK
    # One line an attempt, so each delivery's tries read in order; one not tried yet has a line of its own.
    rows = [{**delivery, **attempt, "try": number}
            for delivery in page["results"]
            for number, attempt in (enumerate(delivery["attempt_log"], 1) if delivery["attempt_log"] else [(None, {})])]
    print_table(rows, ATTEMPT_COLUMNS, empty="no deliveries match")
    if page["count"] > len(page["results"]):
        print(f"({len(page['results'])} of {page['count']} deliveries shown; raise --limit to see more)")
    return EXIT_OK


def _notify_rm(client: Api, args) -> int:
    subscription = client.get(f"subscriptions/{args.id}/")
    client.request("DELETE", f"subscriptions/{args.id}/")
    print_json(subscription) if args.json else print(f"subscription {args.id} '{subscription['name']}' deleted")
    return EXIT_OK


def _notify_enabled(enabled: bool):
    def switch(client: Api, args) -> int:
        subscription = client.request("PATCH", f"subscriptions/{args.id}/", json={"enabled": enabled})
        print_json(subscription) if args.json else print(
            f"subscription {args.id} '{subscription['name']}' {'enabled' if enabled else 'disabled'}")
        return EXIT_OK

    return switch


NOTIFY_ACTIONS = {"list": _notify_list, "add": _notify_add, "test": _notify_test, "deliveries": _notify_deliveries,
                  "rm": _notify_rm, "enable": _notify_enabled(True), "disable": _notify_enabled(False)}
