from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.core import secret_env
from jobs.models import Job


class Command(BaseCommand):
    help = ("Re-encrypt every job's secret env values under the first key of RESPAWN_SECRETS_KEY (a rotation: "
            "set 'NEW,OLD', run this, then drop OLD).")

    def handle(self, *args, **options):
        rotated = 0
        for pk in Job.objects.exclude(secret_env={}).values_list("pk", flat=True).iterator():
            with transaction.atomic():
                job = Job.objects.select_for_update().only("secret_env").get(pk=pk)
                Job.objects.filter(pk=pk).update(secret_env=secret_env.rotate(job.secret_env))
            rotated += 1
        self.stdout.write(f"{rotated} jobs' secret env values re-encrypted under the first key")
