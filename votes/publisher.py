"""Publishing frames from generation threads to a battle's channel-layer group.

Celery workers publish through a process of their own (votes.relay.FrameRelay). The
in-process worker of the embedded mode publishes here: generation runs in a plain thread, but
the channel layer is asyncio, so frames are handed to the web server's own event loop with
run_coroutine_threadsafe (the in-memory layer's queues belong to that loop).
"""

import asyncio
import logging
import time
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from votes import shutdown

PUBLISH_TIMEOUT_SECONDS = 5
logger = logging.getLogger(__name__)


def stamped(frames: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """With ARENA_TRACE_FRAMES (the load test), the frames with the time now in ``field``."""
    if not settings.ARENA_TRACE_FRAMES:
        return frames
    now = time.time()
    return [{**frame, field: now} for frame in frames]


class FramePublisher(Protocol):
    def publish(self, group: str, frames: list[dict[str, Any]]) -> None: ...


class ChannelLayerPublisher:
    """Publishes frames, in order: each publish waits until the channel layer has them (a slow
    Redis slows the reply down rather than piling frames up). A frame that cannot be published
    (Redis restarting) is dropped and logged, never fatal to the reply: the database has the
    text, and clients resync from it (on reconnect, on a gap in the delta numbers, or when a
    reply is quiet for too long)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.layer = get_channel_layer()

    def publish(self, group: str, frames: list[dict[str, Any]]) -> None:
        # Once the server is stopping its loop may never run the send: nobody is left to see it.
        if not frames or shutdown.stopping():
            return
        message = {"type": "battle.frames", "frames": stamped(frames, "sent_at")}
        future = asyncio.run_coroutine_threadsafe(self.layer.group_send(group, message), self.loop)
        try:
            future.result(timeout=PUBLISH_TIMEOUT_SECONDS)
        except Exception as error:
            future.cancel()
            logger.warning("Frames for %s not published (%s: %s)", group, type(error).__name__, error)
