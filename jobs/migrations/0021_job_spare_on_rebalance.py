from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_subscription_secret_sealed'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='spare_on_rebalance',
            field=models.BooleanField(default=False, help_text='On an AWS rebalance recommendation, launch a spare and move a one-node job onto it once it is ready (docs/spares.md).'),
        ),
    ]
