"""A reply that cannot be generated ends as "failed", says so without naming the model, and the
battle goes on: the other side still streams and the voter can still vote."""

import pytest
from channels.db import database_sync_to_async

from votes.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

LONG_PROMPT = "\N{GRINNING FACE}" * 600  # Up to four tokens each: past the test models' 2048.


def saved_replies() -> dict[str, Message]:
    return {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)}


async def test_broken_model_fails_one_side_only(connect_battle, demo_llms, celery_worker) -> None:
    broken = demo_llms[1]
    broken.preset = "/nonexistent/preset-folder"
    await database_sync_to_async(broken.save)()

    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    battle_id = (await client.receive())["battle"]
    frames = await client.receive_both_ends()
    ends = {f["side"]: f for f in frames if f["type"] == "end"}
    assert sorted(f["status"] for f in ends.values()) == ["done", "failed"]
    (failed,) = [f for f in ends.values() if f["status"] == "failed"]
    assert failed["error"] == "This reply could not be generated."
    for raw in client.raw:
        assert "nonexistent" not in raw and broken.name not in raw

    replies = await database_sync_to_async(saved_replies)()
    assert replies[failed["side"]].status == Message.Status.FAILED
    await client.send({"type": "vote", "choice": "both_bad"})
    assert (await client.receive())["type"] == "voted"
    await client.send({"type": "end"})
    revealed = await client.receive()
    assert revealed["type"] == "revealed", revealed
    assert battle_id


async def test_conversation_longer_than_the_context_fails_clearly(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    """Past a model's own context: reached only where the arena's limit is above it (an operator's
    setting; the anonymous roster holds it, tests/test_context_fit.py), in a named battle."""
    settings.ARENA_MAX_CONVERSATION_BYTES = 100_000
    client = await connect_battle()
    await client.send({"type": "start", "mode": "named", "models": [llm.name for llm in demo_llms]})
    await client.receive_until(lambda frame: frame["type"] == "state")
    await client.send({"type": "prompt", "text": LONG_PROMPT})
    await client.receive()
    frames = await client.receive_both_ends()
    ends = [f for f in frames if f["type"] == "end"]
    assert [f["status"] for f in ends] == ["failed", "failed"]
    assert all(f["error"] == "The conversation is too long for these models; start a new battle." for f in ends)
    replies = await database_sync_to_async(saved_replies)()
    assert {m.status for m in replies.values()} == {Message.Status.FAILED}
    # Nothing is left stuck: the next prompt is accepted (not "busy") and answered, with the same
    # clear failure, since the history it carries still does not fit.
    await client.send({"type": "vote", "choice": "both_bad"})
    assert (await client.receive())["type"] == "voted"
    await client.send({"type": "prompt", "text": "Cancel the meeting with Fred."})
    assert (await client.receive())["type"] == "prompt"
    frames = await client.receive_both_ends()
    assert {f["status"] for f in frames if f["type"] == "end"} == {"failed"}


async def test_reply_past_the_time_limit_is_cancelled_and_failed(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    settings.ARENA_GENERATION_TIMEOUT_SECONDS = 0.001
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    await client.receive_until(lambda f: f["type"] == "prompt")
    frames = await client.receive_both_ends()
    ends = [f for f in frames if f["type"] == "end"]
    assert {f["status"] for f in ends} == {"failed"}
    assert {f["error"] for f in ends} == {"This reply took too long and was stopped."}
    replies = await database_sync_to_async(saved_replies)()
    assert {m.stop_reason for m in replies.values()} == {"error"}
