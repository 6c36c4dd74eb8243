"""Publishing frames from generation threads to a battle's channel-layer group.

Generation runs in a plain thread (a Celery worker, or the in-process worker of the embedded
mode), but the channel layer is asyncio. Frames are handed to one long-lived event loop with
run_coroutine_threadsafe: `async_to_sync` would open a new loop and Redis connection per call.
In embedded mode that loop must be the web server's own, because the in-memory layer's queues
belong to it.
"""

import asyncio
import threading
from typing import Any, Protocol

from channels.layers import get_channel_layer

PUBLISH_TIMEOUT_SECONDS = 30


class FramePublisher(Protocol):
    def publish(self, group: str, frames: list[dict[str, Any]]) -> None: ...


class ChannelLayerPublisher:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.layer = get_channel_layer()

    def publish(self, group: str, frames: list[dict[str, Any]]) -> None:
        if not frames:
            return
        message = {"type": "battle.frames", "frames": frames}
        future = asyncio.run_coroutine_threadsafe(self.layer.group_send(group, message), self.loop)
        future.result(timeout=PUBLISH_TIMEOUT_SECONDS)


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
