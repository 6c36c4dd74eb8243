"""Celery beat job: keep the leaderboard snapshots fresh."""

from celery import shared_task

from leaderboard import services

REFRESH_TASK = "leaderboard.refresh_if_due"


@shared_task(name=REFRESH_TASK, ignore_result=True)
def refresh_if_due() -> None:
    services.refresh_if_due()
