"""Embedded mode: no broker, replies generated on threads of the web process, in-memory layer."""

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

import pytest
import websockets
from channels.db import database_sync_to_async

from votes.models import Message
from votes.testing.stack import Stack
from votes.testing.voters import run_voters, session_cookie

VOTERS = 4
MALFORMED_PROMPTS = [
    '{"type": "prompt", "text": ' + "[" * 4000 + "]" * 4000 + "}",
    '{"type": "prompt", "text": "hi \\u0000"}',
    '{"type": "prompt", "text": "hi \\ud800"}',
    '{"type": "prompt", "text": "\\udc00 hi"}',
]

pytestmark = pytest.mark.django_db(transaction=True)


async def send_malformed_prompts(url: str) -> list[str]:
    """Each malformed prompt's answer (an error's code), then the next good prompt's, on one socket."""
    cookie = await asyncio.to_thread(session_cookie, url)
    headers = {"Cookie": cookie, "Origin": url}
    answers = []
    async with websockets.connect(url.replace("http", "ws", 1) + "/ws/battle/", additional_headers=headers) as socket:
        for raw in [*MALFORMED_PROMPTS, json.dumps({"type": "prompt", "text": "Add \u202eFred"})]:
            await socket.send(raw)
            answer = json.loads(await asyncio.wait_for(socket.recv(), 30))
            answers.append(answer.get("code", "prompt" if answer["type"] == "battle" else answer["type"]))
    return answers


async def test_in_process_worker_streams_both_sides(embedded_mode, connect_battle, demo_llms) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    assert (await client.receive())["type"] == "battle"
    assert (await client.receive())["type"] == "prompt"
    frames = await client.receive_both_ends()

    replies = await database_sync_to_async(list)(Message.objects.filter(role=Message.Role.ASSISTANT))
    assert len(replies) == 2
    for reply in replies:
        deltas = [f for f in frames if f["type"] == "delta" and f["side"] == reply.side]
        assert [d["seq"] for d in deltas] == list(range(len(deltas)))
        assert reply.status == Message.Status.DONE
        assert reply.content == "".join(d["text"] for d in deltas)


def test_battles_streaming_at_once_on_sqlite_never_lock_or_hang(smollm2_preset: Path, tmp_path: Path) -> None:
    """The embedded arena as scripts/serve runs it (SQLite, in-memory layer, in-process worker),
    in a daphne of its own, with a real model as slow as the roster's (SmolLM2, both sides):
    several voters play whole battles at once. Every reply streams to its end, none fails or
    waits for the queue limit, and the server log has no lock error."""
    presets = tmp_path / "presets"
    presets.mkdir()
    for name in ("smollm2-a", "smollm2-b"):  # Two contestants, one engine's worth of weights each.
        (presets / name).symlink_to(smollm2_preset, target_is_directory=True)
    stack = Stack(
        database_url="",
        redis_url="",
        log_dir=tmp_path / "logs",
        env={
            "ARENA_VAR_DIR": str(tmp_path / "var"),
            "ARENA_RATE_LIMITS": "battle=30/0/3600,message=20/0/60,vote=60/0/60",  # loopback voters
            # One network's voters, each with two replies at once (as manage.py loadtest runs them).
            "ARENA_REPLIES_PER_NETWORK": "0",
            "ARENA_MAX_NEW_TOKENS": "64",
        },
    )
    for command in (["migrate", "--noinput"], ["register_demo_models", "--dir", str(presets)]):
        setup = stack.spawn(command[0], [sys.executable, "manage.py", *command])
        assert setup.process.wait(timeout=120) == 0, setup.log_tail()
    web, url = stack.start_web()
    try:
        results, _ = asyncio.run(run_voters(url, VOTERS))
        refusals = asyncio.run(send_malformed_prompts(url))
    finally:
        stack.stop()
    # On SQLite too, malformed prompts get an error frame, never a 1011 or an empty battle row.
    assert refusals == ["bad_json", "not_text", "not_text", "not_text", "prompt"]
    with sqlite3.connect(tmp_path / "var" / "arena.sqlite3") as database:
        empty = (
            "SELECT COUNT(*) FROM votes_battle b"
            " WHERE NOT EXISTS (SELECT 1 FROM votes_message m WHERE m.battle_id = b.id)"
        )
        assert database.execute(empty).fetchone() == (0,)
    log = web.log.read_text(errors="replace")
    assert "database is locked" not in log
    assert [error for result in results for error in result.errors] == []
    assert all(result.finished for result in results)
    statuses = [record.status for result in results for record in result.replies.values()]
    why = [line for line in log.splitlines() if "failed" in line or "Error" in line]  # for the report
    assert statuses == ["done"] * (3 * VOTERS), (statuses, why[-20:])  # Two replies to the prompt, one to the fix.
    for result in results:
        for record in result.replies.values():
            assert record.delivered == record.saved and record.saved.strip()
