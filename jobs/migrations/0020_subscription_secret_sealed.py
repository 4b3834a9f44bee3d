"""Webhook signing secrets sealed at rest (respawn_server.jobs.core.secret_env). Reversible while the
key that sealed them is configured: going back without it fails with SecretsKeyError
and, in the migration's transaction, changes nothing."""

from django.db import migrations, models

from respawn_server.jobs.core import secret_env


def rewrite_secrets(change):
    def run(apps, schema_editor):
        Subscription = apps.get_model("jobs", "Subscription")
        for subscription in Subscription.objects.exclude(secret="").only("secret"):
            subscription.secret = change(subscription.secret)
            subscription.save(update_fields=["secret"])

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0019_instance_standby_for"),
    ]

    operations = [
        migrations.AlterField(
            model_name="subscription",
            name="secret",
            field=models.TextField(blank=True, help_text="HMAC-SHA256 key of the webhook signature, sealed "
                                                         "(respawn_server.jobs.core.secret_env): never plaintext."),
        ),
        migrations.RunPython(rewrite_secrets(secret_env.seal_value), rewrite_secrets(secret_env.unseal_value)),
    ]
