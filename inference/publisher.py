"""Publishing frames from generation threads to a battle's channel-layer group.

Generation runs in a plain thread (a Celery worker, or the in-process worker of the embedded
mode), but the channel layer is asyncio. Frames are handed to one long-lived event loop with
run_coroutine_threadsafe: `async_to_sync` would open a new loop and Redis connection per call.
In embedded mode that loop must be the web server's own, because the in-memory layer's queues
belong to it.
"""

import asyncio
import logging
import threading
import time
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

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
        if not frames:
            return
        message = {"type": "battle.frames", "frames": stamped(frames, "sent_at")}
        future = asyncio.run_coroutine_threadsafe(self.layer.group_send(group, message), self.loop)
        try:
            future.result(timeout=PUBLISH_TIMEOUT_SECONDS)
        except Exception as error:
            future.cancel()
            logger.warning("Frames for %s not published (%s: %s)", group, type(error).__name__, error)


_background_loop: asyncio.AbstractEventLoop | None = None
_background_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """One event loop per worker process, running in a daemon thread."""
    global _background_loop
    with _background_lock:
        if _background_loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="arena-publisher", daemon=True).start()
            _background_loop = loop
    return _background_loop
