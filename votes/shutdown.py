"""Stopping the arena's own work when its server is asked to stop (Ctrl-C or SIGTERM).

In the embedded mode the web process also writes the replies and runs the evaluations, on the
threads of ``votes.dispatch``. Python waits for such threads when it exits, so a reply being
written (minutes) or an evaluation run (an hour) would keep a stopped server alive. Instead,
``manage.py serve`` calls :func:`begin` as soon as the server stops taking connections: a reply
ends as stopped at its next look (every batching interval), an evaluation run after its current
step. :func:`finish` then gives them a moment, shuts down the engines of this process (a reply
waiting on one ends at once), and, in the embedded mode, ends in the database whatever is still
unfinished: replies as stopped (``stop_reason`` "shutdown", their text so far kept), evaluation
runs as interrupted (the admin's "Run again" starts one over). Nothing stays "writing" forever.
The caller then exits without waiting for threads that cannot be interrupted (a model being
loaded or compiled, an engine's decode step): ``inference.services.exit_now``.

A Celery worker (``votes.tasks``) calls :func:`begin` when asked to stop, waits for its tasks as
Celery does, then :func:`stop_engines`.
"""

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings

logger = logging.getLogger(__name__)

_stopping = threading.Event()


class Interrupted(Exception):
    """Raised between two steps of long work when the server is stopping."""


def stopping() -> bool:
    """Whether this process's server has been asked to stop."""
    return _stopping.is_set()


def begin() -> None:
    """Tell this process's replies and evaluation runs to stop; returns at once."""
    if not _stopping.is_set():
        logger.info("Stopping: replies in flight end as stopped, evaluation runs as interrupted")
    _stopping.set()


@dataclass(frozen=True)
class Stopped:
    unfinished_jobs: int  # Jobs still on this process's threads after the grace period.
    engines_running: int  # Engines whose decode thread was still in an XLA call.
    replies: int  # Replies the database still had unfinished, ended as stopped.
    evaluations: int  # Evaluation runs ended as interrupted.
    took_s: float


def finish(grace_s: float) -> Stopped:
    """After :func:`begin`: up to ``grace_s`` for the jobs to end on their own, then the engines
    shut down and (embedded mode) the unfinished rows ended."""
    from inference import services as inference_services
    from votes import dispatch, evaluation_services, services

    begin()
    started = time.monotonic()
    left = dispatch.wait_for_in_process_jobs(grace_s)
    stopped = inference_services.stop_local_models(timeout_s=0.5)
    if left:
        left = dispatch.wait_for_in_process_jobs(0.5)
    replies = evaluations = 0
    # Only where this process was the worker: Celery workers elsewhere own their replies.
    if settings.GENERATION_BACKEND == "in-process":
        replies = services.stop_unfinished_replies()
        evaluations = evaluation_services.interrupt_evaluations()
    running = inference_services.local_models_still_running()
    result = Stopped(left, running, replies, evaluations, time.monotonic() - started)
    logger.info(
        "Stopped in %.1f s: %d engine(s) shut down, %d reply(ies) ended as stopped, %d evaluation run(s) "
        "interrupted, %d job(s) and %d engine(s) left behind",
        result.took_s,
        len(stopped),
        replies,
        evaluations,
        left,
        running,
    )
    return result


def stop_engines() -> int:
    """After :func:`begin` and the jobs' end: this process's engines shut down, each given a
    moment to end its XLA call in flight; how many have not (the process must then leave with
    ``inference.services.exit_now``)."""
    from inference import services as inference_services

    begin()
    return inference_services.stop_local_models_to_exit()
