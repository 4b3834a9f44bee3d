import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0014_machine_and_container_image'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('pending', 'pending'), ('sent', 'sent'), ('failed', 'failed')], default='pending', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='DeliveryAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('started_at', models.DateTimeField()),
                ('duration_s', models.FloatField()),
                ('status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True)),
                ('ok', models.BooleanField()),
                ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='jobs.delivery')),
            ],
            options={
                'ordering': ['started_at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='Notification',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('job.succeeded', 'job.succeeded'), ('job.failed', 'job.failed'), ('job.preemption_burst', 'job.preemption_burst'), ('job.recovering_long', 'job.recovering_long'), ('team.budget_warning', 'team.budget_warning'), ('job.launch_held', 'job.launch_held'), ('job.deadline_at_risk', 'job.deadline_at_risk'), ('checkpoint.invalid', 'checkpoint.invalid'), ('test', 'test')], max_length=30)),
                ('key', models.CharField(max_length=200, unique=True)),
                ('title', models.CharField(max_length=300)),
                ('text', models.TextField(blank=True)),
                ('details', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='jobs.job')),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='jobs.team')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.AddField(
            model_name='delivery',
            name='notification',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='jobs.notification'),
        ),
        migrations.CreateModel(
            name='Subscription',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('events', models.JSONField(default=list, help_text='The NotificationKind values to be told of.')),
                ('channel', models.CharField(choices=[('webhook', 'webhook'), ('slack', 'slack'), ('email', 'email')], max_length=10)),
                ('url', models.CharField(blank=True, help_text='Webhook or Slack URL; checked at save and send.', max_length=2000)),
                ('email', models.EmailField(blank=True, max_length=254)),
                ('secret', models.CharField(blank=True, help_text='HMAC-SHA256 key of the webhook signature.', max_length=64)),
                ('preemption_burst', models.PositiveIntegerField(default=3, help_text='Preemptions of one job within an hour that make a burst.', validators=[django.core.validators.MinValueValidator(1)])),
                ('recovering_after_s', models.PositiveIntegerField(default=1800, help_text='A job recovering this long is reported.', validators=[django.core.validators.MinValueValidator(1)])),
                ('enabled', models.BooleanField(default=True)),
                ('failing_reason', models.TextField(blank=True, help_text='Why the last delivery failed every retry; cleared by a later success.')),
                ('failing_since', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='subscriptions', to='jobs.team')),
                ('user', models.ForeignKey(blank=True, help_text="Empty: the team's, managed by its admins.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='subscriptions', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['team', 'name', 'id'],
            },
        ),
        migrations.AddField(
            model_name='delivery',
            name='subscription',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='jobs.subscription'),
        ),
        migrations.AddIndex(
            model_name='subscription',
            index=models.Index(fields=['team', 'enabled'], name='subscription_team_enabled_idx'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(fields=['subscription', '-created_at'], name='delivery_subscription_time_idx'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.UniqueConstraint(fields=('notification', 'subscription'), name='delivery_once_per_subscription'),
        ),
    ]
