"""Nothing is lost: a reply streams on while any page of its battle is open, a reload resumes it,
only every page gone past the grace period stops it, and a battle left idle after a vote ends by
itself so that its votes count. Real websockets, a real Celery worker, PostgreSQL and Redis."""

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async

from leaderboard import services as leaderboard_services
from tests.conftest import engine_serving
from votes import services as votes_services
from votes.models import Battle, Message

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = {"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"}


def replies() -> dict[str, Message]:
    return {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)}


async def start_streaming(connect_battle: Any) -> tuple[Any, str]:
    """A page that has sent the first prompt and seen its first delta; the battle's id."""
    client = await connect_battle()
    await client.send(PROMPT)
    battle = (await client.receive_until(lambda f: f["type"] == "battle"))[-1]
    await client.receive_until(lambda f: f["type"] == "delta")
    return client, battle["battle"]


def text_by_side(frames: list[dict[str, Any]]) -> dict[str, str]:
    texts = {"a": "", "b": ""}
    for frame in frames:
        if frame["type"] == "delta":
            texts[frame["side"]] += frame["text"]
    return texts


async def test_closing_one_page_does_not_stop_what_another_shows(connect_battle, demo_llms, celery_worker) -> None:
    first, public_id = await start_streaming(connect_battle)
    second = await connect_battle(public_id)
    state = (await second.receive_until(lambda f: f["type"] == "state"))[-1]
    await first.communicator.disconnect()

    # A reply that had already ended when the second page opened is in its state, not in frames.
    shown = state["turns"][0]["replies"]
    ends = {side: reply for side, reply in shown.items() if reply["status"] in ("done", "stopped", "failed")}
    while len(ends) < 2:
        frame = await second.receive()
        if frame["type"] == "end":
            ends[frame["side"]] = frame
    assert {end["status"] for end in ends.values()} == {"done"}
    saved = await database_sync_to_async(replies)()
    assert {m.status for m in saved.values()} == {Message.Status.DONE}
    assert not any(m.stop_requested for m in saved.values())
    for side, end in ends.items():
        assert end["text"] == saved[side].content != ""


async def test_a_reload_mid_stream_resumes_the_reply(connect_battle, demo_llms, celery_worker) -> None:
    page, public_id = await start_streaming(connect_battle)
    await page.communicator.disconnect()

    reloaded = await connect_battle(public_id)
    state = (await reloaded.receive_until(lambda f: f["type"] == "state"))[-1]
    shown = {side: reply["text"] for side, reply in state["turns"][0]["replies"].items()}
    await reloaded.receive_both_ends()
    ends = {f["side"]: f for f in reloaded.frames if f["type"] == "end"}
    assert {end["status"] for end in ends.values()} == {"done"}
    saved = await database_sync_to_async(replies)()
    for side, end in ends.items():
        # What the reloaded page had, then what it was sent, is the whole reply.
        assert end["text"] == saved[side].content
        assert end["text"].startswith(shown[side])
    assert any(text for text in text_by_side(reloaded.frames).values()), "the reply went on after the reload"


async def test_every_page_gone_past_the_grace_period_stops_the_replies(
    connect_battle, long_replies, celery_worker, settings
) -> None:
    settings.ARENA_LEAVE_GRACE_SECONDS = 1.0
    settings.ARENA_REPLY_HEARTBEAT_SECONDS = 0.2
    # A slow pace (the models are not measured yet): the text of 400 tokens, however short the
    # sampled tokens are, streams for longer than the grace period, whatever the host's speed.
    settings.ARENA_STREAM_UNMEASURED_CHARS_PER_S = 8
    page, _ = await start_streaming(connect_battle)
    await page.communicator.disconnect()
    left_at = time.monotonic()
    shown_when_left = {side: m.content for side, m in (await database_sync_to_async(replies)()).items()}

    deadline = time.monotonic() + 60
    saved = await database_sync_to_async(replies)()
    while not all(m.is_finished for m in saved.values()):
        assert time.monotonic() < deadline, "the replies of a battle nobody watches did not end"
        await asyncio.sleep(0.1)
        saved = await database_sync_to_async(replies)()
    stopped_after = time.monotonic() - left_at
    ended = {side: (m.status, m.stop_reason, m.error, m.token_count, len(m.content)) for side, m in saved.items()}
    assert {m.status for m in saved.values()} == {Message.Status.STOPPED}, f"not stopped: {ended}"
    for side, reply in saved.items():
        # Stopped while it streamed (the pace holds the text back), whether or not the model
        # had finished generating by then: on an idle host the tiny models write 400 tokens
        # within the grace period.
        assert reply.stop_reason == "cancelled"
        # It went on streaming while the grace period ran.
        assert reply.content.startswith(shown_when_left[side])
        assert len(reply.content) > len(shown_when_left[side])
    assert stopped_after >= settings.ARENA_LEAVE_GRACE_SECONDS
    for llm in long_replies:  # The engines have their slots back.
        engine = await engine_serving(llm)
        assert engine.active_slots == 0


async def finish_first_try(client: Any) -> None:
    await client.send(PROMPT)
    await client.receive_both_ends()
    await client.send({"type": "vote", "choice": "a"})
    await client.receive_until(lambda f: f["type"] == "voted")


async def test_a_battle_left_idle_after_its_vote_ends_and_its_votes_count(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    settings.ARENA_BATTLE_IDLE_SECONDS = 3600
    settings.LEADERBOARD_REFRESH_VOTES = 1
    page = await connect_battle()
    await finish_first_try(page)
    public_id = next(f["battle"] for f in page.frames if f["type"] == "battle")
    await page.communicator.disconnect()

    def overall_votes(refresh: Any) -> int:
        return refresh.snapshots.get(category="overall").votes

    # Not idle long enough yet: the battle goes on, and its vote does not count.
    first = await database_sync_to_async(leaderboard_services.refresh_if_due)()
    assert await database_sync_to_async(overall_votes)(first) == 0
    settings.ARENA_BATTLE_IDLE_SECONDS = 0
    refresh = await database_sync_to_async(leaderboard_services.refresh_if_due)()
    battle = await database_sync_to_async(Battle.objects.get)(public_id=public_id)
    assert battle.is_ended and battle.ended_by == Battle.EndedBy.IDLE
    # The refresh check that ended it counted its vote as new, though cast before the last refresh.
    assert refresh is not None and refresh.pk != first.pk
    assert await database_sync_to_async(overall_votes)(refresh) == 1

    # The names are shown when the voter comes back.
    back = await connect_battle(public_id)
    state = (await back.receive_until(lambda f: f["type"] == "state"))[-1]
    assert state["ended"] and state["ended_by"] == "idle"
    assert set(state["models"]) == {"a", "b"}


async def test_an_open_page_shows_the_reveal_when_its_battle_ends_elsewhere(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    settings.ARENA_LEAVE_GRACE_SECONDS = 0.3
    page = await connect_battle()
    await finish_first_try(page)
    settings.ARENA_BATTLE_IDLE_SECONDS = 0
    # The open page records its presence on the battle's row (a third of the grace period at a
    # time); the idle check skips a row locked at that instant (the next check ends it), as here.
    deadline = time.monotonic() + 10
    while (ended := await database_sync_to_async(votes_services.end_idle_battles)()).battles == 0:
        assert time.monotonic() < deadline, "the idle battle was never ended"
        await asyncio.sleep(0.05)
    assert ended.battles == 1 and ended.votes == 1
    state = (await page.receive_until(lambda f: f["type"] == "state" and f["ended"]))[-1]
    assert state["ended_by"] == "idle" and set(state["models"]) == {"a", "b"}


async def test_an_unvoted_or_unfinished_battle_never_ends_as_idle(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    settings.ARENA_BATTLE_IDLE_SECONDS = 0
    page = await connect_battle()
    await page.send(PROMPT)
    await page.receive_until(lambda f: f["type"] == "prompt")
    # Replies still being written: the battle waits for them.
    assert (await database_sync_to_async(votes_services.end_idle_battles)()).battles == 0
    await page.receive_both_ends()
    # Finished but not voted on: nothing would count, and the voter may be reading.
    assert (await database_sync_to_async(votes_services.end_idle_battles)()).battles == 0
