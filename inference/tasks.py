"""Celery tasks of the inference hosts; each runs on the queue of the model it uses."""

from celery import shared_task

from inference import services
from inference.dispatch import GENERATE_REPLY_TASK
from inference.publisher import ChannelLayerPublisher, background_loop


@shared_task(name=GENERATE_REPLY_TASK, acks_late=True, reject_on_worker_lost=True, time_limit=600)
def generate_reply(message_id: int) -> None:
    services.run_generation(message_id, ChannelLayerPublisher(background_loop()))
