from django.core.management.base import BaseCommand, CommandError

from jobs.pricing import REFRESHERS, PriceRefreshError, refresh


class Command(BaseCommand):
    help = "Fetch current prices from the clouds into PriceQuote (every quote is kept; old ones never change)."

    def add_arguments(self, parser):
        parser.add_argument("providers", nargs="*", choices=REFRESHERS, metavar="provider",
                            help=f"one or more of {', '.join(REFRESHERS)} (default: all)")

    def handle(self, *args, providers=(), **options):
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
