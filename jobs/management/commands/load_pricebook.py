from django.core.management.base import BaseCommand

from respawn_server.jobs.money.pricebook import load_price_book
from respawn_server.jobs.money.seed_prices import seed_price_book


class Command(BaseCommand):
    help = "Load a price book CSV (default: the shipped one) into PriceQuote; rows already present are kept."

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", help="CSV with the columns of jobs/money/data/pricebook.csv")

    def handle(self, *args, path=None, **options):
        book = load_price_book(path) if path else load_price_book()
        added = seed_price_book(book)
        self.stdout.write(f"{added} new price quotes ({len(book.entries)} in the book)")
