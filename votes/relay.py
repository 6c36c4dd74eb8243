"""Publishing a worker's frames from a process of its own: the frame relay.

An inference worker's generation threads and JAX keep its cores and its GIL busy. Publishing
from an event loop inside that process (votes.publisher.ChannelLayerPublisher) means every
step of a `group_send` (each Redis round trip) first waits for the GIL behind those threads:
the load test measured such sends at p50 40 / p99 423 ms. The relay is a small child process
with a GIL of its own that does nothing but `group_send`: generation threads write each frame
to its stdin as one JSON line (a blocking pipe write, which releases the GIL) and go on.

Frames of one group are sent in the order they were written (those that queue up behind a
send go together in the next one); different groups go concurrently. A full pipe blocks the
writer, so a slow Redis still slows the replies down rather than piling frames up. A frame the
channel layer refuses (Redis restarting) is dropped and logged, as with the in-process
publisher: the database has the text and clients resync from it. The relay exits when its
stdin closes, that is when the worker that started it exits or dies.

Run as ``python -m votes.relay`` with the worker's environment (it reads Django's settings
for the channel layer).
"""

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import IO, Any

from django.conf import settings

from votes.publisher import PUBLISH_TIMEOUT_SECONDS, stamped

logger = logging.getLogger(__name__)

# A frame carries at most a reply's text; far above any reply the models may write.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Frames read and not sent yet; beyond them the relay stops reading, its pipe fills up and the
# generation threads wait (a slow Redis slows replies down instead of piling frames up).
MAX_BACKLOG = 1000


class FrameRelay:
    """The worker's side: starts the relay process on first use and writes frames to it. Safe to
    share between threads (one lock orders the writes); a relay that died is started again."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, "-m", "votes.relay"]
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None

    def publish(self, group: str, frames: list[dict[str, Any]]) -> None:
        if not frames:
            return
        frames = stamped(frames, "sent_at")
        line = json.dumps({"group": group, "frames": frames}, separators=(",", ":")).encode() + b"\n"
        with self.lock:
            for _ in range(2):  # Once more with a new relay if the pipe is broken.
                try:
                    stdin = self._stdin()
                    stdin.write(line)
                    stdin.flush()
                    return
                except OSError as error:
                    logger.warning("Frame relay lost (%s: %s); starting a new one", type(error).__name__, error)
                    self._discard()
        logger.warning("Frames for %s not published: no frame relay", group)

    def start(self) -> None:
        """Start the relay process now rather than at the first frame."""
        with self.lock:
            self._stdin()

    def close(self) -> None:
        """Close the relay's stdin (it sends what it has, then exits) and wait for it."""
        with self.lock:
            if self.process is not None:
                process, self.process = self.process, None
                try:
                    process.stdin.close()  # type: ignore[union-attr]
                    process.wait(timeout=PUBLISH_TIMEOUT_SECONDS + 5)
                except (OSError, subprocess.TimeoutExpired):
                    process.kill()
                    process.wait()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _stdin(self) -> IO[bytes]:
        if self.process is None or self.process.poll() is not None:
            self._discard()
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, cwd=settings.BASE_DIR, env=os.environ.copy()
            )
        assert self.process.stdin is not None
        return self.process.stdin

    def _discard(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            with contextlib.suppress(OSError):  # Its pipe may be broken already.
                process.stdin.close()  # type: ignore[union-attr]
            if process.poll() is None:
                process.kill()
            process.wait()


_relay: FrameRelay | None = None
_relay_lock = threading.Lock()


def frame_relay() -> FrameRelay:
    """One relay per worker process."""
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = FrameRelay()
    return _relay


class RelayServer:
    """The relay process's side: reads JSON lines and sends each group's frames in order, one
    send at a time per group. Frames that arrive for a group while its send is under way go
    out together in its next one (one message, several frames), so a busy moment costs fewer
    sends, here and in the web processes that receive them."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.waiting: dict[str, list[dict[str, Any]]] = {}  # Each group's frames not sent yet.
        self.senders: dict[str, asyncio.Task[None]] = {}  # Each group's sending task, if any.
        self.backlog = 0  # Frames read and not sent yet, over every group.
        self.drained = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            try:
                item = json.loads(line)
                group, frames = item["group"], list(item["frames"])
            except (ValueError, KeyError, TypeError) as error:
                logger.error("Frame relay: unreadable line skipped (%s)", error)
                continue
            if frames and "sent_at" in frames[0]:  # Traced by the worker (ARENA_TRACE_FRAMES).
                left_worker_at = time.time()
                frames = [{**frame, "left_worker_at": left_worker_at} for frame in frames]
            self.waiting.setdefault(group, []).extend(frames)
            self.backlog += len(frames)
            if group not in self.senders:
                self.senders[group] = asyncio.create_task(self._send_waiting(group))
            while self.backlog >= MAX_BACKLOG:
                self.drained.clear()
                await self.drained.wait()
        if self.senders:
            await asyncio.gather(*self.senders.values())

    async def _send_waiting(self, group: str) -> None:
        try:
            while frames := self.waiting.pop(group, None):
                try:
                    async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
                        await self.layer.group_send(group, {"type": "battle.frames", "frames": frames})
                except Exception as error:
                    logger.warning("Frames for %s not published (%s: %s)", group, type(error).__name__, error)
                self.backlog -= len(frames)
                if self.backlog < MAX_BACKLOG:
                    self.drained.set()
        finally:
            del self.senders[group]


async def _serve_stdin() -> None:
    from channels.layers import get_channel_layer

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    await RelayServer(get_channel_layer()).serve(reader)


def main() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "arena_site.settings")
    django.setup()
    asyncio.run(_serve_stdin())


if __name__ == "__main__":
    main()
