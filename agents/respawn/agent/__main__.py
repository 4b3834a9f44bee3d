"""`respawn-agent` (also `python -m respawn.agent`): the on-node agent.

    respawn-agent run --control-plane-url URL --bootstrap-token-file PATH \\
        --provider {aws,gcp,azure,local} --work-dir DIR [--metadata-url URL]
    respawn-agent preflight [options] -- <training command>
"""

from __future__ import annotations

import argparse
import logging
import sys

from respawn.agent.config import ConfigError, add_run_arguments, config_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="respawn-agent", description="Run training on a spot VM under Respawn, or check a script is spot-safe.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="register with the control plane and run the job's trainer")
    add_run_arguments(run)
    from respawn.agent.preflight import add_preflight_arguments

    add_preflight_arguments(sub.add_parser("preflight", help="prove a training command resumes exactly after a notice and a SIGKILL"))
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    if args.command == "run":
        try:
            config = config_from_args(args)
        except ConfigError as exc:
            print(f"respawn-agent: {exc}", file=sys.stderr)
            return 2
        from respawn.agent.lifecycle import Agent

        return Agent(config).run()
    from respawn.agent.preflight import run_preflight

    return run_preflight(args)


if __name__ == "__main__":
    sys.exit(main())
