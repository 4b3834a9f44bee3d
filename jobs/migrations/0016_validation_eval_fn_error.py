# Written by hand (issue 18 item 1): the job's eval_fn, and the `error` verdict (the check itself failed).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0015_source_archives"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="validation_eval_fn",
            field=models.CharField(blank=True, help_text="module:function, eval_fn(model, batch) -> float; empty: the one the script stored in its checkpoints, else the default loss (cross-entropy, causal-LM cross-entropy, MSE, the model output's own loss).", max_length=200),
        ),
        migrations.AlterField(
            model_name="checkpoint",
            name="validation",
            field=models.CharField(choices=[("pending", "pending"), ("valid", "valid"), ("invalid", "invalid"), ("skipped", "skipped"), ("error", "error")], default="pending", max_length=10),
        ),
    ]
