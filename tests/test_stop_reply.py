"""A voter who stops a reply cancels its generation; the engine slot is freed. (Leaving stops
nothing at once: tests/test_battle_presence.py.)"""

import pytest
from channels.db import database_sync_to_async

from tests.conftest import engine_serving
from votes import services as votes_services
from votes.models import Message

pytestmark = pytest.mark.django_db(transaction=True)


def replies() -> dict[str, Message]:
    return {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)}


async def test_stop_frame_cancels_streaming_replies(connect_battle, long_replies, celery_worker) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    await client.receive_until(lambda f: f["type"] == "delta")
    await client.send({"type": "stop"})
    frames = await client.receive_both_ends()
    ends = {f["side"]: f for f in client.frames if f["type"] == "end"}
    assert {end["status"] for end in ends.values()} == {"stopped"}

    saved = await database_sync_to_async(replies)()
    for side, end in ends.items():
        deltas = [f for f in client.frames if f["type"] == "delta" and f["side"] == side]
        assert end["text"] == "".join(d["text"] for d in deltas) == saved[side].content
        assert saved[side].status == Message.Status.STOPPED
        # Stopped while it streamed (the pace holds text back), whether or not the model had
        # written all its tokens by then: on an idle host the tiny models write 400 at once.
        assert saved[side].stop_reason == "cancelled"
    assert frames
    # Both engines have their slots back: nothing keeps decoding for a stopped reply.
    for llm in long_replies:
        engine = await engine_serving(llm)
        assert engine.active_slots == 0

    # The battle goes on: a stopped turn counts as finished.
    await client.send({"type": "vote", "choice": "tie"})
    assert (await client.receive())["type"] == "voted"


@pytest.fixture
def unserved_llms(demo_llms, run_id):
    """The demo models on queues no worker consumes: their replies stay pending."""
    for llm in demo_llms:
        llm.queue = f"unserved-{run_id}.{llm.name}"
        llm.save()
    return demo_llms


async def test_stop_before_any_worker_started(connect_battle, unserved_llms) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Cancel the meeting with Fred."})
    await client.receive_until(lambda f: f["type"] == "prompt")
    await client.send({"type": "stop", "side": "b"})
    end = await client.receive(timeout=10)
    assert (end["type"], end["side"], end["status"]) == ("end", "b", "stopped")
    saved = await database_sync_to_async(replies)()
    assert saved["b"].status == Message.Status.STOPPED
    assert saved["a"].status == Message.Status.PENDING
    # A worker that picks the stopped job up later does nothing.
    assert await database_sync_to_async(votes_services.claim_reply)(saved["b"].pk) is None


async def test_concurrent_battles_share_each_models_batch(
    connect_battle, long_replies, celery_worker, voter_session
) -> None:
    """Two voters at once: the thread-pool worker runs both jobs of a model in one engine batch."""
    first = await connect_battle()
    second = await connect_battle()  # Same session, two battles: what matters is concurrency.
    running = [await engine_serving(llm) for llm in long_replies]
    # Nothing runs now; the peak counts from here (other tests batch several battles too).
    assert all(engine.active_slots == 0 for engine in running)
    for engine in running:
        engine.peak_active_slots = 0
    for client in (first, second):
        await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    for client in (first, second):  # Until every one of the four replies is streaming.
        await client.receive_until(
            lambda f, c=client: {d["side"] for d in c.frames if d["type"] == "delta"} == {"a", "b"}
        )
    # Each model's engine decoded one reply of each battle in the same batch at some point.
    assert [engine.peak_active_slots for engine in running] == [2, 2]
    for client in (first, second):
        await client.send({"type": "stop"})
        await client.receive_both_ends()
    assert all(engine.active_slots == 0 for engine in running)
