"""Issue 16: what an agent's reports may do. Event ids are deduplicated per instance;
a register the server fails to answer is counted; an agent's `preempted` waits for the
cloud's word before it feeds the interruption rates. Preemptions recorded before this
were counted as they came and stay counted."""

from django.db import migrations, models


def grandfather_preemptions(apps, schema_editor):
    apps.get_model("jobs", "Instance").objects.filter(end_reason="preempted").update(preemption_confirmed=True)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0009_checkpoint_validation_skipped'),
    ]

    operations = [
        migrations.AddField(
            model_name='instance',
            name='preemption_confirmed',
            field=models.BooleanField(help_text="For an instance ended preempted: whether the cloud confirmed it (the VM was gone or stopped before we terminated it); empty until asked. Only confirmed preemptions feed the interruption rates every team's placement uses.", null=True),
        ),
        migrations.RunPython(grandfather_preemptions, migrations.RunPython.noop),
        migrations.AddField(
            model_name='instance',
            name='register_failures',
            field=models.PositiveIntegerField(default=0, help_text='Registers of this VM the control plane failed to answer (a server error).'),
        ),
        # The old primary key goes first: a table has one.
        migrations.AlterField(
            model_name='processedevent',
            name='event_id',
            field=models.UUIDField(),
        ),
        migrations.AddField(
            model_name='processedevent',
            name='id',
            field=models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID'),
        ),
        migrations.AddConstraint(
            model_name='processedevent',
            constraint=models.UniqueConstraint(fields=('instance', 'event_id'), name='processed_event_once'),
        ),
    ]
