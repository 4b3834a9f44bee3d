"""`respawn` command line: parse arguments, run one command, exit with its code."""

from __future__ import annotations

import argparse
import os
import sys

from respawn.vocabulary.notify import Channel, DeliveryStatus, NotificationKind
from respawn.cli import commands
from respawn.cli.errors import EXIT_BAD_INPUT, CliError

DESCRIPTION = """\
Submit and watch training jobs on a Respawn control plane.

Credentials come from RESPAWN_URL and RESPAWN_TOKEN, or from the file that
`respawn login` writes (~/.config/respawn/credentials, mode 0600)."""

EPILOG = """\
examples:
  respawn login --url https://respawn.example.com --username alice
  respawn submit job.yaml                 # see docs/job-spec.example.yaml
  respawn submit job.yaml --dry-run       # check the file only
  respawn submit job.yaml --workdir .     # ship this directory as the job's code
  respawn submit job.yaml --secret-from-env HF_TOKEN   # a secret env value, stored encrypted
  respawn ls --status running --status queued
  respawn ls --team vision --json | jq '.[].id'
  respawn show 42
  respawn events 42
  respawn logs 42 --follow
  respawn cost 42
  respawn report --from 2026-01 --to 2026-06   # the team's savings, per month and per job
  respawn cancel 42
  respawn tokens create ci --expires-in 30d
  respawn tokens revoke 7
  respawn notify add --channel slack --to https://hooks.slack.com/services/… --events job.failed
  respawn notify deliveries --status failed

exit codes:
  0 ok; 1 refused or failed (conflict, forbidden, server error, unreachable);
  2 bad input (arguments, job file, fields the server rejected);
  3 not logged in, or the token is wrong, expired or revoked; 4 not found"""

JOB_STATUSES = ["queued", "provisioning", "running", "recovering", "cancelling", "succeeded", "failed", "cancelled"]


def event_list(text: str) -> list[str]:
    """--events: comma-separated event names, each one a subscription may ask for."""
    events = [event.strip() for event in text.split(",") if event.strip()]
    unknown = [event for event in events if event not in NotificationKind.SUBSCRIBABLE]
    if unknown or not events:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'none given'}: not an event; the events are "
                                         f"{', '.join(NotificationKind.SUBSCRIBABLE)}")
    return events


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    common.add_argument("--url", help="control plane URL (default: RESPAWN_URL, then the saved login)")
    common.add_argument("--insecure-http", action="store_true",
                        help="allow a plain http:// URL to a host other than this machine (sends the token in clear)")
    # Under `tokens` and `notify`, the same flags after the action; SUPPRESS keeps the
    # level above's value when they are not repeated there.
    nested = argparse.ArgumentParser(add_help=False)
    nested.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    nested.add_argument("--url", default=argparse.SUPPRESS, help="control plane URL")
    nested.add_argument("--insecure-http", action="store_true", default=argparse.SUPPRESS,
                        help="allow plain http:// off this machine")

    parser = argparse.ArgumentParser(prog="respawn", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, func, help, example):
        p = sub.add_parser(name, parents=[common], help=help, description=help, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = command("login", commands.login, "get an API token with your username and password and save it",
                "respawn login --url http://127.0.0.1:8000 --username alice")
    p.add_argument("--username", help="asked for when not given")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin (for scripts)")
    p.add_argument("--token-name", help="name of the new token (default: cli@<hostname>)")

    p = command("submit", commands.submit, "check a job file and submit it", "respawn submit job.yaml")
    p.add_argument("file", help="job-spec YAML (documented in docs/job-spec.example.yaml)")
    p.add_argument("--dry-run", action="store_true", help="only check the file; submit nothing")
    p.add_argument("--secret", metavar="NAME=VALUE", action="append", default=[],
                   help="a secret env variable for the job: stored encrypted, given only to its VMs, never shown "
                        "again (the value is visible to this machine's `ps`: prefer --secret-from-env)")
    p.add_argument("--secret-from-env", metavar="NAME", action="append", default=[],
                   help="a secret env variable for the job, its value taken from this shell's NAME")
    p.add_argument("--workdir", metavar="DIR",
                   help="upload DIR as the job's code (minus what .gitignore and .respawnignore leave out; at most "
                        "RESPAWN_SOURCE_MAX_BYTES, default 100 MiB); the VM unpacks it into working_dir. A tree "
                        "uploaded before is not sent again")

    p = command("ls", commands.ls, "list jobs, newest first", "respawn ls --status running --owner alice")
    p.add_argument("--status", action="append", choices=JOB_STATUSES, help="only this status (repeatable)")
    p.add_argument("--team", help="only this team (name or id)")
    p.add_argument("--owner", help="only jobs of this username")
    p.add_argument("--search", help="only jobs whose name contains this")
    p.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")

    for name, func, help in (("show", commands.show, "everything about one job"),
                             ("events", commands.events, "a job's history: each status change and why"),
                             ("cancel", commands.cancel, "cancel a job (its VMs are terminated)"),
                             ("cost", commands.cost, "what a job has cost, what on-demand would have, the savings")):
        command(name, func, help, f"respawn {name} 42").add_argument("job", type=int, help="job id")

    p = command("drill", commands.drill,
                "interrupt a running VM of a job through its own cloud, on purpose, and see the recovery (members "
                "of the job's team); with --report, the job's drills and how each went",
                "respawn drill 42 --node 1 --without-notice")
    p.add_argument("job", type=int, help="job id")
    p.add_argument("--node", type=int, default=0, metavar="RANK", help="the node to interrupt (default 0)")
    p.add_argument("--without-notice", action="store_true", help="a hard reclaim, with no notice first")
    p.add_argument("--report", action="store_true", help="drill nothing: show the job's drills, newest first")

    p = command("report", commands.report,
                "a team's savings report: spend against on-demand for the same work, per month and per job, "
                "waste by kind, interruptions per zone, cumulative savings (the job pages' figures)",
                "respawn report --team vision --from 2026-01 --to 2026-06 --format csv --table months")
    p.add_argument("--team", help="team name or id (default: your only team)")
    p.add_argument("--from", dest="from_month", metavar="YYYY-MM", help="first month, UTC (default: 11 months before --to)")
    p.add_argument("--to", dest="to_month", metavar="YYYY-MM", help="last month, UTC (default: this month)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="table for people (default), csv (one table, exact figures), json (everything, exact; as --json)")
    p.add_argument("--table", choices=commands.REPORT_SECTIONS,
                   help="only this part (csv: which table, default jobs; table: all but cumulative by default)")

    p = command("logs", commands.logs, "print a job's training output", "respawn logs 42 --follow")
    p.add_argument("job", type=int, help="job id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    p.add_argument("--max-wait", type=float, metavar="SECONDS",
                   help="with --follow: give up (exit 1) if the job has not ended after this long")
    p.add_argument("--poll", type=float, default=2.0, metavar="SECONDS", help="with --follow: check this often")
    p.add_argument("--retry-for", type=float, default=120.0, metavar="SECONDS",
                   help="with --follow: on a dropped connection keep trying this long, then give up (default 120)")

    p = command("tokens", commands.tokens, "list, create or revoke your API tokens", "respawn tokens create ci --expires-in 30d")
    p.set_defaults(tokens_command="ls")
    token_sub = p.add_subparsers(dest="tokens_command", metavar="ACTION")
    token_sub.add_parser("ls", parents=[nested], help="list your tokens (the default)")
    create = token_sub.add_parser("create", parents=[nested], help="create a token; it is shown once")
    create.add_argument("name")
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", metavar="DURATION", help="e.g. 12h, 30d, 8w")
    expiry.add_argument("--expires", metavar="TIME", help="ISO 8601 time, e.g. 2027-01-01T00:00:00Z")
    revoke = token_sub.add_parser("revoke", parents=[nested], help="revoke a token by id")
    revoke.add_argument("id", type=int)

    p = command("notify", commands.notify,
                "your and your team's notifications: webhook, Slack or email subscriptions to what happens to jobs, "
                "test messages, and the delivery log (docs/notifications.md)",
                "respawn notify add --channel webhook --to https://ci.example.com/hook --events job.failed")
    p.set_defaults(team=None)  # `respawn notify` alone lists, with list's defaults
    notify_sub = p.add_subparsers(dest="notify_command", metavar="ACTION")
    listing = notify_sub.add_parser("list", parents=[nested],
                                    help="the subscriptions you see: your own and your teams' (the default)")
    listing.add_argument("--team", help="only this team (name or id)")
    add = notify_sub.add_parser(
        "add", parents=[nested], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="subscribe; a webhook's signing secret is printed this once",
        description="Subscribe a webhook (JSON, signed with HMAC-SHA256), a Slack-compatible incoming webhook, or an "
                    "email address to events of your jobs (or, with --team-wide, every job of the team).",
        epilog="events:\n" + "\n".join(f"  {kind:<22}{NotificationKind.LABELS[kind]}"
                                         for kind in NotificationKind.SUBSCRIBABLE)
               + "\n\nexample:\n  respawn notify add --channel email --email me@example.com "
                 "--events job.failed,job.succeeded")
    add.add_argument("--channel", required=True, choices=Channel.ALL)
    add.add_argument("--to", dest="hook_url", metavar="URL",
                     help="where a webhook or Slack message is posted (http or https; private addresses are refused "
                          "unless the server allows them)")
    add.add_argument("--email", help="where the email channel writes")
    add.add_argument("--events", required=True, type=event_list, metavar="EVENT,...",
                     help="comma-separated, e.g. job.failed,job.succeeded (all listed below)")
    add.add_argument("--team-wide", action="store_true",
                     help="the team's subscription, for every job of the team (team admins only); default: yours, "
                          "for the jobs you own")
    add.add_argument("--team", help="team name or id (default: your only team)")
    add.add_argument("--name", help="what it is for (default: the channel and where it goes)")
    test = notify_sub.add_parser("test", parents=[nested],
                                 help="send a test message through a subscription (see its delivery in `deliveries`)")
    test.add_argument("id", type=int, help="subscription id")
    deliveries = notify_sub.add_parser("deliveries", parents=[nested],
                                       help="the delivery log, newest first: each delivery with its attempts")
    deliveries.add_argument("--subscription", type=int, metavar="ID", help="only this subscription's")
    deliveries.add_argument("--status", choices=DeliveryStatus.ALL, help="only deliveries in this status")
    deliveries.add_argument("--limit", type=int, default=50, help="at most this many deliveries (default 50)")
    for name, help in (("rm", "delete a subscription"),
                       ("disable", "stop a subscription's deliveries, keeping it"),
                       ("enable", "deliver to a disabled subscription again")):
        notify_sub.add_parser(name, parents=[nested], help=help).add_argument("id", type=int, help="subscription id")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"respawn: error: {e.message}", file=sys.stderr)
        for detail in e.details:
            print(f"  {detail}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `respawn ls | head`: the reader has what it wanted. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not raise (and print) the same error again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command a pipe cut short


if __name__ == "__main__":
    sys.exit(main())
