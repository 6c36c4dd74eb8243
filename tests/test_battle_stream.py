"""The whole path: websocket prompt -> Celery worker on Redis -> real keras-hub model -> deltas."""

import pytest
from channels.db import database_sync_to_async

from votes.models import Battle, Message, Vote

pytestmark = pytest.mark.django_db(transaction=True)


def replies_by_side(battle: Battle, turn: int) -> dict[str, Message]:
    return {m.side: m for m in Message.objects.filter(battle=battle, turn=turn, role=Message.Role.ASSISTANT)}


async def test_prompt_streams_both_sides_complete_and_in_order(connect_battle, demo_llms, celery_worker) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})

    battle_frame = await client.receive()
    assert battle_frame["type"] == "battle"
    prompt_frame = await client.receive()
    assert prompt_frame == {
        "type": "prompt",
        "turn": 0,
        "text": "Add a meeting with Fred on Nov 11 at 5PM",
        "sides": ["a", "b"],
        "corrects": [],  # A prompt to both sides is never a voter's correction.
    }
    frames = await client.receive_both_ends()

    battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_frame["battle"])
    saved = await database_sync_to_async(replies_by_side)(battle, 0)
    for side in ("a", "b"):
        deltas = [f for f in frames if f["type"] == "delta" and f["side"] == side]
        (end,) = [f for f in frames if f["type"] == "end" and f["side"] == side]
        assert [d["seq"] for d in deltas] == list(range(len(deltas))), "deltas lost or out of order"
        assert all(d["turn"] == 0 and d["text"] for d in deltas)
        streamed = "".join(d["text"] for d in deltas)
        assert end["status"] == "done"
        assert end["seq"] == len(deltas)
        assert end["text"] == streamed
        assert end["stats"] == {}  # Speed and token counts would tell the models apart.
        reply = saved[side]
        assert reply.status == Message.Status.DONE
        assert reply.content == streamed
        assert reply.token_count > 0
        assert reply.time_to_first_token_ms is not None and reply.duration_ms is not None
        # The end frame closes the side's stream: no delta follows it.
        assert [f for f in frames if f.get("side") == side][-1] is end


async def test_conversation_continues_with_full_history(connect_battle, demo_llms, celery_worker) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    battle_id = (await client.receive())["battle"]
    await client.receive_both_ends()
    await client.send({"type": "vote", "choice": "both_bad"})
    assert (await client.receive())["type"] == "voted"
    await client.send({"type": "prompt", "text": "The current year is 2024."})
    frames = await client.receive_both_ends()
    assert {f["turn"] for f in frames if f["type"] in ("delta", "end")} == {1}

    battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
    messages = await database_sync_to_async(list)(Message.objects.filter(battle=battle).order_by("turn", "side"))
    assert len(messages) == 8  # two turns x two sides x (prompt, reply)
    assert all(m.status == Message.Status.DONE for m in messages)


async def test_reconnecting_client_gets_state_from_database(connect_battle, demo_llms, celery_worker) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Cancel the meeting with Fred."})
    battle_id = (await client.receive())["battle"]
    frames = await client.receive_both_ends()
    ends = {f["side"]: f for f in frames if f["type"] == "end"}

    again = await connect_battle(battle_id)
    state = await again.receive()
    assert state["type"] == "state" and state["battle"] == battle_id
    (turn,) = state["turns"]
    assert turn["prompt"] == "Cancel the meeting with Fred."
    for side in ("a", "b"):
        assert turn["replies"][side]["status"] == "done"
        assert turn["replies"][side]["text"] == ends[side]["text"]
        assert turn["replies"][side]["seq"] == ends[side]["seq"]
    assert state["models"] is None and state["votes"] == {}

    # The reconnected client can go on, vote and end the battle.
    await again.send({"type": "vote", "choice": "tie"})
    assert (await again.receive())["type"] == "voted"
    await again.send({"type": "end"})
    revealed = await again.receive()
    assert revealed["type"] == "revealed"
    assert await database_sync_to_async(Vote.objects.filter(battle__public_id=battle_id).exists)()
