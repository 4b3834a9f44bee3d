"""`manage.py build_agent_wheel`: the agent's wheel VMs install (respawn_server.jobs.fleet.agent_dist).

Run at install and deploy time (make install, the control plane's Docker image), and
after changing `agents/`: VMs launched afterwards get the new wheel."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand

from respawn_server.jobs.fleet import agent_dist


class Command(BaseCommand):
    help = "Build the agent's wheel and its pinned requirements into RESPAWN_AGENT_DIST_DIR (default var/dist)."

    def add_arguments(self, parser):
        parser.add_argument("--out", type=Path, default=None, help="Directory to build into instead.")

    def handle(self, *args, out: Path | None = None, **options):
        dist = agent_dist.build(out)
        self.stdout.write(f"{dist.wheel} sha256 {dist.wheel_sha256}\npinned requirements sha256 "
                          f"{dist.requirements_sha256}")
