"""An inference worker killed mid-reply: the side fails with a clear error and a retry, the battle,
its earlier turns and its votes stay intact, and the lost job never comes back to life."""

import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from inference.models import LLM
from votes import services
from votes.models import Battle, Message, Vote
from votes.testing.stack import Stack, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def make_reply(llms: list[LLM], status: str, heartbeat_age_s: float) -> Message:
    battle = Battle.objects.create(model_a=llms[0], model_b=llms[1], voter_key="v" * 64)
    Message.objects.create(battle=battle, side="a", turn=0, role=Message.Role.USER, content="Hi")
    return Message.objects.create(
        battle=battle,
        side="a",
        turn=0,
        role=Message.Role.ASSISTANT,
        status=status,
        content="Partial" if status == Message.Status.STREAMING else "",
        delta_count=2 if status == Message.Status.STREAMING else 0,
        heartbeat=timezone.now() - timedelta(seconds=heartbeat_age_s),
    )


def test_silent_replies_are_failed_with_a_reason_and_live_ones_are_left(demo_llms, settings) -> None:
    settings.ARENA_REPLY_STALL_SECONDS = 30
    settings.ARENA_REPLY_QUEUE_SECONDS = 300
    lost = make_reply(demo_llms, Message.Status.STREAMING, 31)
    alive = make_reply(demo_llms, Message.Status.STREAMING, 5)
    unclaimed = make_reply(demo_llms, Message.Status.PENDING, 301)
    queued = make_reply(demo_llms, Message.Status.PENDING, 100)

    failed = services.fail_stalled_replies()

    assert {(f.battle_public_id, f.error) for f in failed} == {
        (lost.battle.public_id, services.WORKER_LOST),
        (unclaimed.battle.public_id, services.NOT_PICKED_UP),
    }
    lost_frame = next(f.end_frame() for f in failed if f.battle_public_id == lost.battle.public_id)
    assert lost_frame == {
        "type": "end",
        "side": "a",
        "turn": 0,
        "seq": 2,
        "status": "failed",
        "text": "Partial",  # what the voter had seen is kept
        "stats": {},
        "cut": False,  # a cap did not end it
        "error": services.WORKER_LOST,
    }
    for reply, status in [(lost, "failed"), (alive, "streaming"), (unclaimed, "failed"), (queued, "pending")]:
        reply.refresh_from_db()
        assert reply.status == status
    assert services.fail_stalled_replies() == []  # failed once, announced once
    # The lost worker's job, delivered again by the broker, finds nothing to generate; nor does a
    # late finish from a worker that was only cut off: the voter has been told already.
    assert services.claim_reply(lost.pk, 0) is None
    assert not services.finish_reply(
        lost.pk,
        status="done",
        content="Late",
        delta_count=3,
        stop_reason="stop",
        token_count=3,
        time_to_first_token_ms=1,
        duration_ms=1,
    )


def test_a_retried_reply_ignores_the_jobs_of_earlier_attempts(demo_llms) -> None:
    reply = make_reply(demo_llms, Message.Status.STREAMING, 60)
    services.fail_stalled_replies()
    retried = services.regenerate_reply(battle=reply.battle, side="a")
    assert retried.job.attempt == 1
    assert services.claim_reply(reply.pk, 0) is None  # the lost job, redelivered late
    assert services.claim_reply(reply.pk, 1) == Message.Status.PENDING
    reply.refresh_from_db()
    assert (reply.status, reply.error, reply.content) == (Message.Status.STREAMING, "", "")


async def resync_until_failed(client: Any, side: str, turn: int, limit_s: float = 60) -> dict[str, Any]:
    """What the page does when a busy reply is quiet: ask for the state until the side ends."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await client.send({"type": "sync"})
        while not await client.communicator.receive_nothing(timeout=0.5):
            frame = await client.receive()
            if frame["type"] == "end" and frame["side"] == side and frame["turn"] == turn:
                return frame
    raise AssertionError(f"side {side} never failed; frames: {client.frames[-6:]}")


async def test_worker_killed_mid_reply(connect_battle, demo_llms, celery_worker, settings, tmp_path: Path) -> None:
    # One model runs on an inference host of its own, a separate worker process, which is killed.
    host_model = demo_llms[0]
    host_model.queue = f"lost-host-{uuid.uuid4().hex[:8]}"
    await database_sync_to_async(host_model.save)()
    settings.ARENA_REPLY_STALL_SECONDS = 2
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        # A quick heartbeat, and a pace slow enough that the reply is still running when it dies.
        env={
            "ARENA_REPLY_HEARTBEAT_SECONDS": "0.2",
            "ARENA_STREAM_CHARS_PER_S": "30",
            "ARENA_STREAM_FIRST_TEXT_SECONDS": "0",
        },
    )
    try:
        host = await sync_to_async(stack.start_worker)("lost-host", [host_model.queue])
        client = await connect_battle()
        await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
        battle_id = (await client.receive())["battle"]
        first_ends = {f["side"]: f for f in await client.receive_both_ends() if f["type"] == "end"}
        assert {f["status"] for f in first_ends.values()} == {"done"}
        await client.send({"type": "vote", "choice": "b"})
        await client.receive_until(lambda f: f["type"] == "voted")

        battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
        side = "a" if battle.model_a_id == host_model.pk else "b"
        # A long reply this time, so that it is still streaming when the host dies: the pace
        # counts from the job's start, and a slow first token (a compile) may have made a short
        # reply due all at once.
        host_model.max_new_tokens = 96
        await database_sync_to_async(host_model.save)()
        await client.send({"type": "prompt", "text": "It is at 6PM, not 5PM.", "side": side})
        await client.receive_until(lambda f: f["type"] == "delta" and f["side"] == side and f["turn"] == 1)
        await sync_to_async(host.kill)()

        failed = await resync_until_failed(client, side, turn=1)
        assert failed["status"] == "failed"
        assert failed["error"] == services.WORKER_LOST
        reply = await database_sync_to_async(Message.objects.get)(
            battle=battle, side=side, turn=1, role=Message.Role.ASSISTANT
        )
        assert (reply.status, reply.error, reply.stop_reason) == ("failed", services.WORKER_LOST, "error")
        # The battle, its first turn and its vote are intact.
        messages = await database_sync_to_async(list)(
            Message.objects.filter(battle=battle, turn=0).values_list("side", "role", "status", "content")
        )
        assert sorted((s, r, st) for s, r, st, _ in messages) == [
            ("a", "assistant", "done"),
            ("a", "user", "done"),
            ("b", "assistant", "done"),
            ("b", "user", "done"),
        ]
        assert {(s, c) for s, r, _, c in messages if r == "assistant"} == {
            (s, f["text"]) for s, f in first_ends.items()
        }
        votes = await database_sync_to_async(list)(Vote.objects.filter(battle=battle).values_list("stage", "choice"))
        assert votes == [("first_try", "b")]
        assert (await database_sync_to_async(Battle.objects.get)(pk=battle.pk)).state == Battle.State.ACTIVE

        # The host comes back; the voter presses Retry and the reply is generated again.
        host_model.max_new_tokens = 24
        await database_sync_to_async(host_model.save)()
        await sync_to_async(stack.start_worker)("lost-host-again", [host_model.queue])
        await client.send({"type": "regenerate", "side": side})
        await client.receive_until(lambda f: f["type"] == "regenerating")
        done = await client.receive_until(lambda f: f["type"] == "end" and f["side"] == side)
        assert done[-1]["status"] == "done", done[-1]
        await client.send({"type": "vote", "choice": side})
        await client.receive_until(lambda f: f["type"] == "voted")
        await client.send({"type": "end"})
        revealed = await client.receive_until(lambda f: f["type"] == "revealed")
        assert revealed[-1]["votes"] == {"first_try": "b", "after_fix": side}
        reply = await database_sync_to_async(Message.objects.get)(pk=reply.pk)
        assert (reply.status, reply.error, reply.regenerations) == ("done", "", 1)
    finally:
        await sync_to_async(stack.stop)()


async def test_beat_fails_replies_whose_worker_is_gone_and_tells_their_pages(demo_llms, settings) -> None:
    from channels.layers import get_channel_layer

    from votes.selectors import battle_group
    from votes.tasks import fail_stalled_replies

    settings.ARENA_REPLY_STALL_SECONDS = 30
    lost = await database_sync_to_async(make_reply)(demo_llms, Message.Status.STREAMING, 120)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(battle_group(lost.battle.public_id), channel)

    await sync_to_async(fail_stalled_replies)()

    message = await layer.receive(channel)
    assert message["frames"] == [
        {
            "type": "end",
            "side": "a",
            "turn": 0,
            "seq": 2,
            "status": "failed",
            "text": "Partial",
            "stats": {},
            "cut": False,
            "error": services.WORKER_LOST,
        }
    ]
    assert (await database_sync_to_async(Message.objects.get)(pk=lost.pk)).status == Message.Status.FAILED
