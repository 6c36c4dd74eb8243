"""The Celery application: generation jobs go to one queue per model ("model.<name>")."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "arena_site.settings")

app = Celery("arena_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _serve_metrics(**kwargs: object) -> None:
    """Each worker serves its metrics on ARENA_METRICS_PORT, if set (arena_site.metrics)."""
    from arena_site import metrics

    metrics.serve_worker_metrics(**kwargs)


@worker_process_shutdown.connect
def _pool_process_exited(**kwargs: object) -> None:
    from arena_site import metrics

    metrics.pool_process_exited(**kwargs)
