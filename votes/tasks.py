"""Celery tasks of the votes app: battle replies (on the queue of each reply's model), evaluation
runs, and the beat's periodic jobs."""

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from django.conf import settings

from arena_site.priority import lower_priority
from votes import evaluation_services, generation, shutdown
from votes.dispatch import GENERATE_REPLY_TASK
from votes.evaluation_services import RUN_EVALUATION_TASK
from votes.relay import frame_relay

logger = logging.getLogger(__name__)


# Acknowledged only once finished, and requeued if a pool process dies mid-reply: the reply then
# starts over (the client is told to clear it). When the whole worker dies the broker keeps the
# job until its visibility timeout; the reply is failed long before (fail_stalled_replies), and
# the late redelivery, like any job of an attempt since retried, finds nothing to claim.
# Thread pools ignore Celery's time limits, so run_generation enforces
# ARENA_GENERATION_TIMEOUT_SECONDS itself.
@shared_task(name=GENERATE_REPLY_TASK, acks_late=True, reject_on_worker_lost=True)
def generate_reply(message_id: int, attempt: int | None = None) -> None:
    generation.run_generation(message_id, frame_relay(), attempt)


@worker_ready.connect
def start_frame_relay(**kwargs: Any) -> None:
    """The frame relay starts with the worker, and before the worker lowers its own CPU priority
    (ARENA_WORKER_NICE, ARENA_WORKER_SCHED_IDLE, for hosts it shares with the web tier): the
    relay keeps the normal priority, so frames leave promptly while inference takes every core."""
    frame_relay().start()
    nice, idle = settings.ARENA_WORKER_NICE, settings.ARENA_WORKER_SCHED_IDLE
    if nice or idle:
        threads = lower_priority(nice, idle=idle)
        logger.info(
            "Worker priority lowered (nice +%s%s, %s threads); its frame relay keeps its own",
            nice,
            ", SCHED_IDLE" if idle else "",
            threads,
        )


@worker_shutting_down.connect
def stop_work_in_flight(**kwargs: Any) -> None:
    """Asked to stop (SIGTERM, Ctrl-C: compose's stop, a rolling restart), the worker waits for
    its tasks; its replies end as stopped at their next look and its evaluation run after its
    current step, as interrupted (votes.shutdown), so the wait is seconds, not a whole reply."""
    shutdown.begin()


@worker_shutdown.connect
def stop_engines(sender: Any = None, **kwargs: Any) -> None:
    """Once its tasks have ended, a worker asked to stop shuts its engines down before it exits:
    an engine's decode thread may be in an XLA call (a step, a compilation, shrinking its caches
    after the last reply), and Python's finalisation would end it there and abort the process.
    If one has not ended within a moment, the worker leaves without finalising."""
    from inference import services as inference_services

    if not shutdown.stopping():  # Not asked to stop (a test's in-process worker): keep the engines.
        return
    if shutdown.stop_engines():
        logger.info("An engine is still in an XLA call: leaving without waiting for it")
        inference_services.exit_now(getattr(sender, "exitcode", None) or 0)


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
    from votes import services
    from votes.selectors import battle_group

    publisher = frame_relay()
    for reply in services.fail_stalled_replies():
        publisher.publish(battle_group(reply.battle_public_id), [reply.end_frame()])
