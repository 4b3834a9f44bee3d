from django.core.management.base import BaseCommand, CommandError

from respawn_server.jobs.money.refreshers import REFRESHERS, PriceRefreshError, refresh


class Command(BaseCommand):
    help = "Fetch current prices from the clouds into PriceQuote (every quote is kept; old ones never change)."

    def add_arguments(self, parser):
        # Checked in handle(): argparse (3.11) rejects an empty list against `choices`.
        parser.add_argument("providers", nargs="*", metavar="provider",
                            help=f"one or more of {', '.join(REFRESHERS)} (default: all)")

    def handle(self, *args, providers=(), **options):
        unknown = [p for p in providers if p not in REFRESHERS]
        if unknown:
            raise CommandError(f"no price refresher for {', '.join(unknown)}; choose from {', '.join(REFRESHERS)}")
        failed = []
        for provider in providers or REFRESHERS:
            try:
                result = refresh(provider)
            except PriceRefreshError as exc:
                self.stderr.write(f"{provider}: {exc}")
                failed.append(provider)
                continue
            self.stdout.write(f"{provider}: {result.seen} quotes read, {result.added} new")
        if failed:
            raise CommandError(f"price refresh failed for {', '.join(failed)}")
