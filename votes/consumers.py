"""The battle websocket: prompts and votes in, state, deltas and end frames out.

Thin on purpose: frames are parsed by votes.protocol, every write goes through votes.services,
and generation is handed to votes.dispatch. docs/protocol.md describes the frames.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from arena_site import unavailable
from votes import rate_limits, reply_caps, selectors, services, socket_caps
from votes.dispatch import enqueue_generations
from votes.models import Battle
from votes.protocol import (
    ArenaError,
    EndFrame,
    PromptFrame,
    RateFrame,
    RegenerateFrame,
    StartFrame,
    StopFrame,
    SyncFrame,
    VoteFrame,
    end_frame,
    error_frame,
    parse_client_frame,
)
from votes.services import FailedReply, GenerationJob

logger = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = ArenaError("unavailable", unavailable.MESSAGE)

# The sockets' queries run in a pool of their own, not in asgiref's one thread-sensitive thread:
# a consumer awaiting a query takes none of its channel-layer frames meanwhile, so with a single
# shared thread every page's stream waited behind every other page's queries (manage.py
# loadtest, 100 battles: p99 4.1 s with it, 0.6 s without). Each call is a whole transaction.
query_threads = ThreadPoolExecutor(max_workers=settings.ARENA_WEB_QUERY_THREADS, thread_name_prefix="arena-query")


def in_thread(func: Any, *, database: bool = True) -> Any:
    """``func`` made awaitable in the query pool; ``database`` closes stale connections around it."""
    runner = DatabaseSyncToAsync if database else SyncToAsync
    return runner(func, thread_sensitive=False, executor=query_threads)


# Close code for "try again later": the page reconnects with back-off and resyncs.
TRY_AGAIN_LATER = 1013
# Close code for a socket past the open-socket caps (votes.socket_caps): a 44xx, so the page does
# not reconnect by itself into the same refusal.
TOO_MANY_SOCKETS = 4429


class BattleConsumer(AsyncWebsocketConsumer):
    battle: Battle | None
    voter_key: str
    address: str | None
    network_key: str
    group: str | None
    watching: asyncio.Task[None] | None
    holding_slots: asyncio.Task[None] | None

    async def connect(self) -> None:
        self.battle = None
        self.group = None
        self.watching = None
        self.holding_slots = None
        # The client's address: the peer's, or behind a trusted proxy the one it forwards
        # (arena_site.asgi.build_application).
        client = self.scope.get("client")
        self.address = str(client[0]) if client else None
        self.network_key = services.network_key_for(self.address)  # The battles' voter network.
        await self.accept()
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        if not session_key:
            await self.send_error(ArenaError("no_session", "Open the arena page first, then connect."))
            await self.close(code=4401)
            return
        self.voter_key = services.voter_key_for(session_key)
        if not await self.claim_socket_slots():
            return
        public_id = self.scope["url_route"]["kwargs"].get("public_id")
        if public_id is None:
            return  # A new battle: it is created with the first prompt.
        try:
            battle = await in_thread(selectors.battle_for_voter)(public_id=public_id, voter_key=self.voter_key)
            if battle is None:
                await self.send_error(ArenaError("not_found", "No such battle; start a new one."))
                await self.close(code=4404)
                return
            await self.join(battle)
            await self.resync()
        except unavailable.OUTAGES:
            logger.exception("Battle %s could not be loaded", public_id)
            await self.send_error(DATABASE_UNAVAILABLE)
            await self.close(code=TRY_AGAIN_LATER)

    async def claim_socket_slots(self) -> bool:
        """This socket's slot under its session's and its network's caps; refused past either."""
        try:
            refusal = await in_thread(socket_caps.claim, database=False)(
                self.channel_name, session=self.voter_key, address=self.address
            )
        except Exception:  # Redis down: the caps are a defence, not a reason to refuse everyone.
            logger.warning("Socket slots not counted: their store is unavailable", exc_info=True)
            return True
        if refusal is not None:
            await self.send_error(ArenaError("too_many_sockets", refusal.message))
            await self.close(code=TOO_MANY_SOCKETS)
            return False
        self.holding_slots = asyncio.create_task(self.hold_socket_slots())
        return True

    async def hold_socket_slots(self) -> None:
        """Keep this socket's slots from expiring while it is open; given back on disconnect."""
        while True:
            await asyncio.sleep(socket_caps.REFRESH_SECONDS)
            try:
                await in_thread(socket_caps.refresh, database=False)(
                    self.channel_name, session=self.voter_key, address=self.address
                )
            except Exception:
                logger.warning("Socket slots not refreshed: their store is unavailable", exc_info=True)

    async def disconnect(self, code: int) -> None:
        if self.holding_slots is not None:
            self.holding_slots.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.holding_slots
            self.holding_slots = None
            try:
                await in_thread(socket_caps.release, database=False)(
                    self.channel_name, session=self.voter_key, address=self.address
                )
            except Exception:  # They expire by themselves.
                logger.warning("Socket slots not given back: their store is unavailable", exc_info=True)
        if self.watching is not None:
            self.watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watching
        if self.battle is not None and self.group:
            # Leaving stops nothing: the replies go on while another page (or this one, reloaded)
            # watches, and stop only once every page has been gone for the grace period
            # (services.touch_reply). The grace period counts from now.
            try:
                await in_thread(services.keep_watching)(battle=self.battle)
            except unavailable.OUTAGES:
                logger.warning("Battle %s: the page's leaving not recorded, the database is unavailable", self.battle)
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def watch(self) -> None:
        """While this page is open: tell the workers so (a third of the grace period at a time),
        and show the reveal if the battle was ended elsewhere (another page, or as idle)."""
        assert self.battle is not None
        interval = settings.ARENA_LEAVE_GRACE_SECONDS / 3
        while True:
            try:
                ended = await in_thread(services.keep_watching)(battle=self.battle)
            except unavailable.OUTAGES:
                logger.warning("Battle %s: the page's presence not recorded, the database is unavailable", self.battle)
                ended = False
            if ended:
                await self.send_state()
                return
            await asyncio.sleep(interval)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            await self.handle_frame(text_data)
        except ArenaError as error:
            await self.send_error(error)
        except unavailable.OUTAGES:
            # Every write is one transaction: whatever this frame asked for was not saved.
            logger.exception("A frame of battle %s failed: the database is unavailable", self.battle)
            await self.send_error(DATABASE_UNAVAILABLE)

    async def handle_frame(self, text_data: str | None) -> None:
        await self.count("frame")  # Before parsing: a malformed frame costs the sender too.
        frame = parse_client_frame(
            text_data,
            max_bytes=settings.ARENA_MAX_FRAME_BYTES,
            max_prompt_chars=settings.ARENA_MAX_PROMPT_CHARS,
        )
        if isinstance(frame, StartFrame):
            await self.handle_start(frame)
        elif isinstance(frame, PromptFrame):
            await self.handle_prompt(frame)
        elif self.battle is None or self.group is None:
            if not isinstance(frame, SyncFrame):
                raise ArenaError("not_ready", "Send a prompt first: there is no battle yet.")
            await self.send_state()
        elif isinstance(frame, VoteFrame):
            await self.count("vote")
            vote = await in_thread(services.cast_vote)(battle=self.battle, choice=frame.choice, stage=frame.stage)
            await self.publish(
                {"type": "voted", "stage": vote.stage, "choice": vote.choice, "after_turn": vote.after_turn}
            )
        elif isinstance(frame, RateFrame):
            await self.count("vote")
            reply = await in_thread(services.rate_reply)(
                battle=self.battle, side=frame.side, turn=frame.turn, rating=frame.rating
            )
            await self.publish({"type": "rated", "side": reply.side, "turn": reply.turn, "rating": frame.rating})
        elif isinstance(frame, RegenerateFrame):
            await self.count("message")
            reservation = await in_thread(reply_caps.reserve)(self.address, replies=1)
            try:
                regenerated = await in_thread(services.regenerate_reply)(battle=self.battle, side=frame.side)
            except BaseException:
                await in_thread(reservation.release, database=False)()
                raise
            await in_thread(reservation.record, database=False)([regenerated.job.message_id])
            await self.publish({"type": "regenerating", "side": regenerated.side, "turn": regenerated.turn})
            await self.enqueue([regenerated.job])
        elif isinstance(frame, EndFrame):
            await in_thread(services.end_battle)(battle=self.battle)
            state = await in_thread(self._load_state)()
            await self.publish({"type": "revealed", **{k: v for k, v in state.items() if k != "type"}})
        elif isinstance(frame, StopFrame):
            await self.stop_replies(side=frame.side)
        elif isinstance(frame, SyncFrame):
            await self.resync()

    async def handle_start(self, frame: StartFrame) -> None:
        if self.battle is not None:
            raise ArenaError("already_started", "This page already has a battle; open a new one to start another.")
        task = None
        if frame.task is not None:
            task = await in_thread(selectors.task_by_slug)(frame.task)
            if task is None:
                raise ArenaError("no_task", "There is no such task; pick one from the list.")
        await self.count("battle")
        battle = await in_thread(services.start_battle)(
            voter_key=self.voter_key,
            network_key=self.network_key,
            task=task,
            mode=frame.mode,
            models=frame.models,
        )
        await self.join(battle)
        await self.send_json({"type": "battle", "battle": battle.public_id})
        await self.send_state()

    async def handle_prompt(self, frame: PromptFrame) -> None:
        if self.battle is None and frame.side is not None:
            raise ArenaError("both_sides_first", "The first prompt goes to both sides.")
        # Before anything is stored: past its network's cap on replies in flight, nothing is. The
        # places are taken as they are checked, so prompts sent at once cannot all pass.
        reservation = await in_thread(reply_caps.reserve)(self.address, replies=1 if frame.side else 2)
        try:
            if self.battle is None:  # A first prompt without a start frame: free chat.
                await self.count("battle")
                await self.count("message")
                battle, submitted = await in_thread(services.start_battle_with_prompt)(
                    voter_key=self.voter_key, network_key=self.network_key, text=frame.text
                )
                await self.join(battle)
                await self.send_json({"type": "battle", "battle": battle.public_id})
            else:
                await self.count("message")
                submitted = await in_thread(services.submit_prompt)(
                    battle=self.battle, text=frame.text, side=frame.side
                )
            assert self.group is not None
        except BaseException:
            await in_thread(reservation.release, database=False)()
            raise
        await in_thread(reservation.record, database=False)([job.message_id for job in submitted.jobs])
        sides = [submitted.side] if submitted.side else ["a", "b"]
        await self.publish(
            {
                "type": "prompt",
                "turn": submitted.turn,
                "text": submitted.text,
                "sides": sides,
                "corrects": list(submitted.corrects),
            }
        )
        await self.enqueue(submitted.jobs)

    async def enqueue(self, jobs: Sequence[GenerationJob]) -> None:
        """Hand the jobs to the workers; if the broker can't take them, fail the replies at once
        (the voter can retry) rather than leave them waiting for a worker that will never come."""
        try:
            await enqueue_generations(jobs)
        except Exception:
            logger.exception("Generation jobs of battle %s could not be queued", self.battle)
            failed = await in_thread(services.fail_unqueued_replies)([job.message_id for job in jobs])
            for reply in failed:  # To this connection: the channel layer may be down too.
                await self.send_json(reply.end_frame())

    async def resync(self) -> None:
        """The full state from the database, after failing any reply whose worker is gone."""
        assert self.battle is not None
        failed: list[FailedReply] = await in_thread(services.fail_stalled_replies)(battle=self.battle)
        if failed:
            await self.channel_layer.group_send(
                self.group, {"type": "battle.frames", "frames": [reply.end_frame() for reply in failed]}
            )
        await self.send_state()

    async def count(self, action: str) -> None:
        """Count an action against this voter's and this address's budgets (votes.rate_limits)."""
        await in_thread(rate_limits.hit, database=False)(action, session=self.voter_key, address=self.address)

    async def publish(self, frame: dict[str, Any]) -> None:
        """Send a frame to every connection of this battle (the voter may have several tabs)."""
        assert self.group is not None
        await self.channel_layer.group_send(self.group, {"type": "battle.frames", "frames": [frame]})

    async def stop_replies(self, side: str | None) -> None:
        assert self.battle is not None and self.group is not None
        stopped = await in_thread(services.request_stop)(battle=self.battle, side=side)
        # Replies no worker had started yet end here; running ones end from their worker.
        frames = [end_frame(reply.side, reply.turn, seq=0, status="stopped", text="", stats={}) for reply in stopped]
        if frames:
            await self.channel_layer.group_send(self.group, {"type": "battle.frames", "frames": frames})

    async def join(self, battle: Battle) -> None:
        self.battle = battle
        self.group = selectors.battle_group(battle.public_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        if not battle.is_ended:
            self.watching = asyncio.create_task(self.watch())

    async def send_state(self) -> None:
        if self.battle is None:
            await self.send_json(await in_thread(selectors.empty_state)())
            return
        state = await in_thread(self._load_state)()
        await self.send_json(state)

    def _load_state(self) -> dict[str, Any]:
        assert self.battle is not None
        self.battle.refresh_from_db()
        return selectors.battle_state(self.battle)

    async def battle_frames(self, event: dict[str, Any]) -> None:
        """Frames published to the battle's group (by workers or other connections)."""
        for frame in event["frames"]:
            if "sent_at" in frame:  # A traced frame (ARENA_TRACE_FRAMES): when the web tier relayed it.
                frame = {**frame, "relayed_at": time.time()}
            await self.send_json(frame)

    async def send_error(self, error: ArenaError) -> None:
        await self.send_json(error_frame(error))

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))
