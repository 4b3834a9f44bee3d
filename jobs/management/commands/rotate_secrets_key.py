from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.models import Job, Subscription


class Command(BaseCommand):
    help = ("Re-encrypt every job's secret env values and every webhook's signing secret under the first key of "
            "RESPAWN_SECRETS_KEY (a rotation: set 'NEW,OLD', run this, then drop OLD).")

    def handle(self, *args, **options):
        jobs, jobs_lost = rotate_rows(Job.objects.exclude(secret_env={}), "secret_env", secret_env.rotate)
        hooks, hooks_lost = rotate_rows(Subscription.objects.exclude(secret=""), "secret", secret_env.rotate_value)
        self.stdout.write(f"{jobs} jobs' secret env values and {hooks} webhook signing secrets re-encrypted under "
                          "the first key")
        if jobs_lost or hooks_lost:
            # The others are rotated already: dropping the old key now loses only these,
            # which no configured key opens anyway.
            raise CommandError(f"no configured key decrypts the secrets of jobs {jobs_lost or 'none'} and "
                               f"subscriptions {hooks_lost or 'none'}: they were left as they are (put back the "
                               "key that sealed them and run this again, or submit and subscribe again)")


def rotate_rows(rows, field: str, rotate) -> tuple[int, list[int]]:
    """`field` of each row re-encrypted, one row a transaction (the row locked while it is
    rewritten, so a concurrent change is not undone); the count done and the ids left."""
    done, lost = 0, []
    for pk in rows.values_list("pk", flat=True).iterator():
        with transaction.atomic():
            value = rows.model.objects.select_for_update().filter(pk=pk).values_list(field, flat=True).first()
            if value is None:
                continue  # deleted meanwhile
            try:
                rotated = rotate(value)
            except secret_env.SecretsKeyError:
                lost.append(pk)
                continue
            rows.model.objects.filter(pk=pk).update(**{field: rotated})
        done += 1
    return done, lost
