"""Celery tasks of the inference hosts; each runs on the queue of the model it uses."""

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from inference import services
from inference.dispatch import GENERATE_REPLY_TASK
from inference.priority import lower_priority
from inference.relay import frame_relay

logger = logging.getLogger(__name__)


# Acknowledged only once finished, and requeued if a pool process dies mid-reply: the reply then
# starts over (the client is told to clear it). When the whole worker dies the broker keeps the
# job until its visibility timeout; the reply is failed long before (fail_stalled_replies), and
# the late redelivery, like any job of an attempt since retried, finds nothing to claim.
# Thread pools ignore Celery's time limits, so run_generation enforces
# ARENA_GENERATION_TIMEOUT_SECONDS itself.
@shared_task(name=GENERATE_REPLY_TASK, acks_late=True, reject_on_worker_lost=True)
def generate_reply(message_id: int, attempt: int | None = None) -> None:
    services.run_generation(message_id, frame_relay(), attempt)


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
