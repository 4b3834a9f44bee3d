"""Two reports whose transactions overlap, as two agents' requests do on a real server:
the second runs while the first's transaction is still open. Where the code makes the
second wait for the first to commit, the first's wait runs out and it commits first."""

import threading

from django.db import connection, transaction


def in_overlapping_transactions(first, second, *, hold_s: float = 1.0) -> None:
    """Run `first()` in a transaction held open until `second()` (in its own thread and
    connection) returns or `hold_s` passes; needs `django_db(transaction=True)`."""
    first_done, second_done = threading.Event(), threading.Event()

    def run_first():
        try:
            with transaction.atomic():
                first()
                first_done.set()
                second_done.wait(timeout=hold_s)
        finally:
            connection.close()

    def run_second():
        try:
            first_done.wait(timeout=10)
            second()
            second_done.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=run_first), threading.Thread(target=run_second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
