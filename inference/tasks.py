"""Celery tasks of the inference hosts; each runs on the queue of the model it uses."""

from celery import shared_task

from inference import services
from inference.dispatch import GENERATE_REPLY_TASK
from inference.publisher import ChannelLayerPublisher, background_loop


# Acknowledged only once finished, and requeued if a pool process dies mid-reply: the reply then
# starts over (the client is told to clear it). When the whole worker dies the broker keeps the
# job until its visibility timeout; the reply is failed long before (fail_stalled_replies), and
# the late redelivery, like any job of an attempt since retried, finds nothing to claim.
# Thread pools ignore Celery's time limits, so run_generation enforces
# ARENA_GENERATION_TIMEOUT_SECONDS itself.
@shared_task(name=GENERATE_REPLY_TASK, acks_late=True, reject_on_worker_lost=True)
def generate_reply(message_id: int, attempt: int | None = None) -> None:
    services.run_generation(message_id, ChannelLayerPublisher(background_loop()), attempt)
