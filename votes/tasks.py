"""Celery tasks of the votes app."""

from celery import shared_task

from votes import evaluation_services
from votes.evaluation_services import RUN_EVALUATION_TASK


# Acknowledged when done; a run redelivered after a lost worker is skipped unless still pending.
@shared_task(name=RUN_EVALUATION_TASK, acks_late=True, reject_on_worker_lost=True)
def run_evaluation(run_id: int) -> None:
    evaluation_services.run_evaluation(run_id)


@shared_task(name="votes.export_dump", ignore_result=True)
def export_dump() -> None:
    """Nightly (beat): the day's dump in ARENA_DUMP_DIR, which the API lists and serves."""
    from pathlib import Path

    from django.conf import settings

    from votes.dumps import export_dump as write_dump

    write_dump(Path(settings.ARENA_DUMP_DIR))


@shared_task(name="votes.purge_expired_sessions", ignore_result=True)
def purge_expired_sessions() -> None:
    """Nightly (beat): delete expired sessions (Django's own clear_expired, as clearsessions)."""
    from importlib import import_module

    from django.conf import settings

    import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()


@shared_task(name="votes.fail_stalled_replies", ignore_result=True)
def fail_stalled_replies() -> None:
    """Every minute (beat): fail the replies whose worker is gone, and tell their voters."""
    from inference.relay import frame_relay
    from votes import services
    from votes.selectors import battle_group

    publisher = frame_relay()
    for reply in services.fail_stalled_replies():
        publisher.publish(battle_group(reply.battle_public_id), [reply.end_frame()])
