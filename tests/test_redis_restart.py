"""Redis restarted during a battle: the page's socket reconnects and resyncs from the database,
the replies being streamed are not lost, and the battle goes on to its votes and reveal.

A redis-server of the test's own sits under daphne and a Celery worker (real processes); it is
killed mid-reply and started again empty, as a Redis without persistence comes back."""

import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import websockets
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connection

from votes.models import Battle, Message
from votes.testing.stack import RedisServer, Stack, database_url
from votes.testing.voters import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


class ReconnectingPage:
    """The page's websocket logic: reconnect when the socket closes, ask for the state when a
    reply has been quiet, and rebuild the replies from each state frame."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.cookie = ""
        self.battle = ""
        self.socket: Any = None
        self.reconnects = 0
        self.replies: dict[tuple[int, str], dict[str, Any]] = {}
        self.frames: list[dict[str, Any]] = []

    async def open(self) -> None:
        self.cookie = await asyncio.to_thread(session_cookie, self.base_url)
        await self.connect()

    async def connect(self) -> None:
        path = f"/ws/battle/{self.battle}/" if self.battle else "/ws/battle/"
        self.socket = await websockets.connect(
            self.base_url.replace("http", "ws", 1) + path,
            additional_headers={"Cookie": self.cookie, "Origin": self.base_url},
        )

    async def send(self, frame: dict[str, Any]) -> None:
        await self.socket.send(json.dumps(frame))

    async def receive(self, quiet_s: float = 2.0) -> dict[str, Any] | None:
        try:
            frame = json.loads(await asyncio.wait_for(self.socket.recv(), quiet_s))
        except TimeoutError:
            await self.send({"type": "sync"})
            return None
        except websockets.ConnectionClosed:
            # Back-off as the page does; Redis may still be starting.
            await asyncio.sleep(0.5)
            self.reconnects += 1
            with contextlib.suppress(OSError, websockets.InvalidStatus, websockets.InvalidHandshake):
                await self.connect()
            return None
        self.frames.append(frame)
        self.apply(frame)
        return frame

    def apply(self, frame: dict[str, Any]) -> None:
        if frame["type"] == "battle":
            self.battle = frame["battle"]
        elif frame["type"] in ("state", "revealed"):
            self.replies = {
                (turn["turn"], side): dict(reply) for turn in frame["turns"] for side, reply in turn["replies"].items()
            }
        elif frame["type"] == "prompt":
            for side in frame["sides"]:
                self.replies[(frame["turn"], side)] = {"status": "pending", "text": "", "seq": 0}
        elif frame["type"] == "delta":
            reply = self.replies.get((frame["turn"], frame["side"]))
            if reply is not None and frame["seq"] == reply["seq"]:
                reply["text"] += frame["text"]
                reply["seq"] += 1
                reply["status"] = "streaming"
        elif frame["type"] == "end":
            self.replies[(frame["turn"], frame["side"])] = {**frame}

    def finished(self, turn: int, sides: str) -> bool:
        return all(self.replies.get((turn, side), {}).get("status") in ("done", "stopped", "failed") for side in sides)

    async def until(self, predicate: Any, limit_s: float = 120) -> None:
        deadline = time.monotonic() + limit_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; last frames: {self.frames[-5:]}")
            await self.receive()

    async def request(self, frame: dict[str, Any], reply_type: str) -> dict[str, Any]:
        """Send a frame and wait for its answer, sending it again if the socket was lost."""
        await self.send(frame)
        for _ in range(60):
            answer = await self.receive()
            if answer is not None and answer["type"] == reply_type:
                return answer
            if answer is not None and answer["type"] == "error":
                raise AssertionError(f"{frame} refused: {answer}")
        raise AssertionError(f"no {reply_type} for {frame}; last frames: {self.frames[-5:]}")


async def test_redis_restart_during_a_battle(demo_llms, settings, tmp_path: Path) -> None:
    queue = f"redis-restart-{uuid.uuid4().hex[:8]}"
    for llm in demo_llms:
        llm.queue = f"{queue}.{llm.name}"
        await database_sync_to_async(llm.save)()
    redis_server = RedisServer(tmp_path / "redis")
    await sync_to_async(redis_server.start)()
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=redis_server.url,
        log_dir=tmp_path,
        # A slow pace: the replies are still streaming when Redis goes away.
        env={"ARENA_STREAM_CHARS_PER_S": "30", "ARENA_STREAM_FIRST_TEXT_SECONDS": "0"},
    )
    try:
        await sync_to_async(stack.start_worker)("worker", [llm.queue for llm in demo_llms])
        _, url = await sync_to_async(stack.start_web)()
        page = ReconnectingPage(url)
        await page.open()
        await page.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
        await page.until(lambda: any(f["type"] == "delta" for f in page.frames))

        await sync_to_async(redis_server.restart)()

        await page.until(lambda: page.finished(0, "ab"))
        # The socket is lost with Redis (daphne closes it): the page reconnects, though the state
        # it asked for meanwhile may already have shown the replies finished.
        await page.until(lambda: page.reconnects >= 1, limit_s=30)
        battle = await database_sync_to_async(Battle.objects.get)(public_id=page.battle)
        saved = await database_sync_to_async(
            lambda: {m.side: m for m in Message.objects.filter(battle=battle, role="assistant", turn=0)}
        )()
        for side in "ab":
            assert saved[side].status == "done", saved[side].status
            assert page.replies[(0, side)]["text"] == saved[side].content  # resynced, whole

        # The battle goes on over the restarted Redis: a vote, a correction, a vote, the reveal.
        await page.request({"type": "vote", "choice": "a"}, "voted")
        await page.request({"type": "prompt", "text": "It is at 6PM, not 5PM.", "side": "b"}, "prompt")
        await page.until(lambda: page.finished(1, "b"))
        await page.request({"type": "vote", "choice": "b"}, "voted")
        revealed = await page.request({"type": "end"}, "revealed")
        assert revealed["votes"] == {"first_try": "a", "after_fix": "b"}
        assert set(revealed["models"].values()) == {llm.name for llm in demo_llms}
        await page.socket.close()
    finally:
        await sync_to_async(stack.stop)()
        await sync_to_async(redis_server.stop)()
