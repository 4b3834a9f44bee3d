from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0016_validation_eval_fn_error"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="secret_env",
            field=models.JSONField(blank=True, default=dict,
                                   help_text="Secret environment: names to encrypted values, never plaintext."),
        ),
    ]
