import os

from celery import Celery

from respawn_server import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "respawn_server.settings")
broker.install()

app = Celery("respawn")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
