# Issue 17 item 2: a job's code, uploaded as a content-addressed archive or named as a git commit.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0013_step_points"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SourceArchive",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("sha256", models.CharField(help_text="Hex SHA-256 of the archive's bytes.", max_length=64)),
                ("bytes", models.PositiveBigIntegerField()),
                ("unpacked_bytes", models.PositiveBigIntegerField(help_text="Sum of its files' sizes.")),
                ("files", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT,
                                           related_name="source_archives", to="jobs.team")),
                ("uploaded_by", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL,
                                                  related_name="+", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("team", "sha256"),
                                                        name="source_archive_team_sha256_unique")],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="source_archive",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="jobs", to="jobs.sourcearchive"),
        ),
        migrations.AddField(
            model_name="job",
            name="source_git_url",
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.AddField(
            model_name="job",
            name="source_git_commit",
            field=models.CharField(blank=True, help_text="Full commit id checked out.", max_length=64),
        ),
    ]
