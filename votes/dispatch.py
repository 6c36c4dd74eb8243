"""Hands generation jobs to whoever runs them: Celery queues, or a thread in this process.

This module is imported by the web tier: it must never import Keras or JAX. The in-process
worker imports the generation service lazily, inside its thread.
"""

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from arena_site.celery import app as celery_app

if TYPE_CHECKING:
    from votes.services import GenerationJob

logger = logging.getLogger(__name__)

GENERATE_REPLY_TASK = "votes.generate_reply"

# Several threads, so that concurrent replies of one model join the same decode batch.
_in_process_executor = ThreadPoolExecutor(
    max_workers=settings.ARENA_IN_PROCESS_WORKERS, thread_name_prefix="arena-generation"
)
# Jobs handed to those threads and not finished yet (queued or running): votes.shutdown waits
# for them to end when the server stops.
_unfinished = 0
_unfinished_changed = threading.Condition()


def _submit(work: Callable[[], None]) -> None:
    global _unfinished

    def tracked() -> None:
        global _unfinished
        try:
            work()
        finally:
            with _unfinished_changed:
                _unfinished -= 1
                _unfinished_changed.notify_all()

    with _unfinished_changed:
        _unfinished += 1
    _in_process_executor.submit(tracked)


def wait_for_in_process_jobs(timeout_s: float) -> int:
    """Wait up to ``timeout_s`` for this process's generation threads to finish their jobs; how
    many are still queued or running."""
    with _unfinished_changed:
        _unfinished_changed.wait_for(lambda: _unfinished == 0, timeout=timeout_s)
        return _unfinished


async def enqueue_generations(jobs: Sequence["GenerationJob"]) -> None:
    if settings.GENERATION_BACKEND == "celery":
        await sync_to_async(_send_to_celery)(jobs)
        return
    loop = asyncio.get_running_loop()
    for job in jobs:
        _submit(functools.partial(_generate_in_process, job.message_id, job.attempt, loop))


def _send_to_celery(jobs: Sequence["GenerationJob"]) -> None:
    for job in jobs:
        celery_app.send_task(GENERATE_REPLY_TASK, args=[job.message_id, job.attempt], queue=job.queue)


def _generate_in_process(message_id: int, attempt: int, loop: asyncio.AbstractEventLoop) -> None:
    from votes import generation
    from votes.publisher import ChannelLayerPublisher

    try:
        generation.run_generation(message_id, ChannelLayerPublisher(loop), attempt)
    except Exception:  # The thread must survive one failed job; run_generation logs details.
        logger.exception("In-process generation of message %s failed", message_id)
    finally:
        close_old_connections()


def run_in_background(work: Callable[[], None], what: str) -> None:
    """Embedded mode's worker for other jobs (an evaluation run): ``work`` on a thread of this
    process's generation pool, its failure logged, its database connections closed after."""

    def run() -> None:
        try:
            work()
        except Exception:
            logger.exception("In-process %s failed", what)
        finally:
            close_old_connections()

    _submit(run)
