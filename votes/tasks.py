"""Celery tasks of the votes app."""

from celery import shared_task

from inference.dispatch import RUN_EVALUATION_TASK
from votes import evaluation_services


# Acknowledged when done; a run redelivered after a lost worker is skipped unless still pending.
@shared_task(name=RUN_EVALUATION_TASK, acks_late=True, reject_on_worker_lost=True)
def run_evaluation(run_id: int) -> None:
    evaluation_services.run_evaluation(run_id)
