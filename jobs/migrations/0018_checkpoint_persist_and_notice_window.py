from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0017_job_secret_env"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="persist_s",
            field=models.FloatField(blank=True, null=True, help_text="save_s less its pacing"),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="notice_window_s",
            field=models.FloatField(blank=True, null=True, help_text="the notice the saving VM's cloud gives; null: unknown"),
        ),
    ]
