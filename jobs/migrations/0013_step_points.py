import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0012_notifications"),
    ]

    operations = [
        migrations.CreateModel(
            name="StepPoint",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.PositiveBigIntegerField()),
                ("time", models.DateTimeField()),
                ("loss", models.FloatField(blank=True, null=True)),
                ("samples_per_s", models.FloatField(blank=True, null=True)),
                ("instance", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="step_points",
                                               to="jobs.instance")),
                ("job", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="step_points",
                                          to="jobs.job")),
            ],
            options={
                "ordering": ["instance", "step"],
                "indexes": [models.Index(fields=["job", "instance", "step"], name="steppoint_job_curve_idx")],
                "constraints": [models.UniqueConstraint(fields=("instance", "step"),
                                                        name="steppoint_instance_step_unique")],
            },
        ),
    ]
