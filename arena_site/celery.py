"""The Celery application: generation jobs go to one queue per model ("model.<name>")."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "arena_site.settings")

app = Celery("arena_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
