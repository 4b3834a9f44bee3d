"""`image` was one field used two ways: documented as a container image, passed to
each cloud as its boot image. It becomes `machine_image` (per cloud) and
`container_image`; an old value moves to whichever its shape says it was."""

import re

from django.db import migrations, models

# The shapes each cloud takes as a boot image, frozen here as they stood at this migration.
AMI = re.compile(r"ami-[0-9a-f]{8,17}")
GCE_IMAGE = re.compile(r"(https://www\.googleapis\.com/compute/v1/)?(projects/[^/\s]+/)?global/images/\S+")
AZURE_URN = re.compile(r"[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+")


def split_image(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.exclude(image="").only("pk", "image").iterator():
        cloud = next((name for name, shape in (("aws", AMI), ("gcp", GCE_IMAGE), ("azure", AZURE_URN))
                      if shape.fullmatch(job.image)), None)
        if cloud:
            Job.objects.filter(pk=job.pk).update(machine_image={cloud: job.image})
        else:
            Job.objects.filter(pk=job.pk).update(container_image=job.image)


def join_image(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.only("pk", "machine_image", "container_image").iterator():
        image = job.container_image or next(iter(job.machine_image.values()), "")
        if image:
            Job.objects.filter(pk=job.pk).update(image=image[:300])


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_login_limit_ceilings_invitations"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="container_image",
            field=models.CharField(
                blank=True, help_text="OCI image the trainer runs in (podman or docker on the VM); empty: the VM's "
                "own Python.", max_length=300),
        ),
        migrations.AddField(
            model_name="job",
            name="machine_image",
            field=models.JSONField(
                blank=True, default=dict, help_text='Boot image per cloud: {"aws": "ami-…", "gcp": '
                '"projects/…/global/images/…", "azure": "publisher:offer:sku:version"}; a cloud not named boots its '
                "provider's default image."),
        ),
        migrations.RunPython(split_image, join_image),
        migrations.RemoveField(model_name="job", name="image"),
    ]
