"""The battle websocket: prompts and votes in, state, deltas and end frames out.

Thin on purpose: frames are parsed by votes.protocol, every write goes through votes.services,
and generation is handed to inference.dispatch. docs/protocol.md describes the frames.
"""

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from inference.dispatch import enqueue_generations
from votes import selectors, services
from votes.models import Battle
from votes.protocol import (
    ArenaError,
    PromptFrame,
    StopFrame,
    SyncFrame,
    VoteFrame,
    end_frame,
    error_frame,
    parse_client_frame,
)


class BattleConsumer(AsyncWebsocketConsumer):
    battle: Battle | None
    voter_key: str
    group: str | None

    async def connect(self) -> None:
        self.battle = None
        self.group = None
        await self.accept()
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        if not session_key:
            await self.send_error(ArenaError("no_session", "Open the arena page first, then connect."))
            await self.close(code=4401)
            return
        self.voter_key = services.voter_key_for(session_key)
        public_id = self.scope["url_route"]["kwargs"].get("public_id")
        if public_id is None:
            return  # A new battle: it is created with the first prompt.
        battle = await database_sync_to_async(selectors.battle_for_voter)(public_id=public_id, voter_key=self.voter_key)
        if battle is None:
            await self.send_error(ArenaError("not_found", "No such battle; start a new one."))
            await self.close(code=4404)
            return
        await self.join(battle)
        await self.send_state()

    async def disconnect(self, code: int) -> None:
        if self.battle is not None and self.group:
            # A voter who leaves stops the replies still being generated for them.
            await self.stop_replies(side=None)
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = parse_client_frame(
                text_data,
                max_bytes=settings.ARENA_MAX_FRAME_BYTES,
                max_prompt_chars=settings.ARENA_MAX_PROMPT_CHARS,
            )
            if isinstance(frame, PromptFrame):
                await self.handle_prompt(frame)
            elif isinstance(frame, VoteFrame):
                await self.handle_vote(frame)
            elif isinstance(frame, StopFrame):
                if self.battle is not None:
                    await self.stop_replies(side=frame.side)
            elif isinstance(frame, SyncFrame):
                await self.send_state()
        except ArenaError as error:
            await self.send_error(error)

    async def handle_prompt(self, frame: PromptFrame) -> None:
        if self.battle is None:
            battle = await database_sync_to_async(services.start_battle)(voter_key=self.voter_key)
            await self.join(battle)
            await self.send_json({"type": "battle", "battle": battle.public_id})
        assert self.battle is not None and self.group is not None
        submitted = await database_sync_to_async(services.submit_prompt)(battle=self.battle, text=frame.text)
        await self.channel_layer.group_send(
            self.group,
            {"type": "battle.frames", "frames": [{"type": "prompt", "turn": submitted.turn, "text": submitted.text}]},
        )
        await enqueue_generations(submitted.jobs)

    async def handle_vote(self, frame: VoteFrame) -> None:
        if self.battle is None or self.group is None:
            raise ArenaError("not_ready", "Send a prompt and read both replies before voting.")
        vote = await database_sync_to_async(services.cast_vote)(battle=self.battle, choice=frame.choice)
        self.battle = vote.battle
        await self.channel_layer.group_send(
            self.group,
            {
                "type": "battle.frames",
                "frames": [{"type": "revealed", "vote": vote.choice, "models": vote.battle.reveal()}],
            },
        )

    async def stop_replies(self, side: str | None) -> None:
        assert self.battle is not None and self.group is not None
        stopped = await database_sync_to_async(services.request_stop)(battle=self.battle, side=side)
        # Replies no worker had started yet end here; running ones end from their worker.
        frames = [end_frame(reply.side, reply.turn, seq=0, status="stopped", text="", stats={}) for reply in stopped]
        if frames:
            await self.channel_layer.group_send(self.group, {"type": "battle.frames", "frames": frames})

    async def join(self, battle: Battle) -> None:
        self.battle = battle
        self.group = selectors.battle_group(battle.public_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def send_state(self) -> None:
        if self.battle is None:
            await self.send_json({"type": "state", "battle": None, "turns": [], "vote": None, "models": None})
            return
        state = await database_sync_to_async(self._load_state)()
        await self.send_json(state)

    def _load_state(self) -> dict[str, Any]:
        assert self.battle is not None
        self.battle.refresh_from_db()
        return selectors.battle_state(self.battle)

    async def battle_frames(self, event: dict[str, Any]) -> None:
        """Frames published to the battle's group (by workers or other connections)."""
        for frame in event["frames"]:
            await self.send_json(frame)

    async def send_error(self, error: ArenaError) -> None:
        await self.send_json(error_frame(error))

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))
