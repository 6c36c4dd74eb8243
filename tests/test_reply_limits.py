"""Replies end: each model has a cap in tokens and one in seconds (admin-editable), and a reply
that reaches either ends as done, its text kept, and says it was cut: in its end frame, in the
battle's state and in the research data (``stop_reason`` length or time). In an anonymous
battle the seconds cap is the arena's, the same whichever models play. Real websockets, a real
Celery worker and the tiny models."""

from typing import Any

import pytest
from channels.db import database_sync_to_async

from inference.models import LLM
from votes import research, selectors, services
from votes.models import Battle, Message, Vote

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = {"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"}


def saved_replies() -> dict[str, Message]:
    return {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)}


def set_caps(models: list[LLM], **caps: Any) -> None:
    LLM.objects.filter(pk__in=[m.pk for m in models]).update(**caps)


async def test_a_reply_past_its_seconds_is_cut_where_the_voter_is(
    connect_battle, long_replies, celery_worker, settings
) -> None:
    settings.ARENA_STREAM_CHARS_PER_S = 100  # 400 tokens of the tiny model: many seconds to show.
    await database_sync_to_async(set_caps)(long_replies, max_reply_seconds=1.5)
    client = await connect_battle()
    await client.send(PROMPT)
    await client.receive_both_ends()
    ends = {f["side"]: f for f in client.frames if f["type"] == "end"}
    saved = await database_sync_to_async(saved_replies)()
    for side, end in ends.items():
        deltas = "".join(f["text"] for f in client.frames if f["type"] == "delta" and f["side"] == side)
        assert end["status"] == "done" and end["cut"] is True
        # What the voter saw when the time ran out is the reply, and nothing after it.
        assert end["text"] == deltas == saved[side].content != ""
        assert saved[side].stop_reason == "time" and saved[side].cut
        assert len(saved[side].content) < 400  # 1.5 s at 100 characters a second, and the first wait.
        # The model's own speed is still measured: the pace measures its models on all their
        # replies, the long ones the cap cuts included.
        assert saved[side].model_chars_per_s > 0
    await client.send({"type": "sync"})
    state = await client.receive_until(lambda f: f["type"] == "state")
    assert all(reply["cut"] for turn in state[-1]["turns"] for reply in turn["replies"].values())
    # A cut reply is finished: the battle goes on.
    await client.send({"type": "vote", "choice": "tie"})
    assert (await client.receive())["type"] == "voted"


async def test_a_reply_at_its_token_cap_is_cut_and_the_data_says_so(
    connect_battle, long_replies, celery_worker
) -> None:
    await database_sync_to_async(set_caps)(long_replies, max_new_tokens=6)
    client = await connect_battle()
    await client.send(PROMPT)
    await client.receive_both_ends()
    ends = [f for f in client.frames if f["type"] == "end"]
    assert [(end["status"], end["cut"]) for end in ends] == [("done", True), ("done", True)]
    await client.send({"type": "vote", "choice": "a"})
    assert (await client.receive())["type"] == "voted"

    def record() -> dict[str, Any]:
        return research.vote_record(Vote.objects.select_related("battle").get())

    exported = await database_sync_to_async(record)()
    for side in "ab":
        (rating,) = exported[f"ratings_{side}"]
        assert rating["stop_reason"] == "length" and rating["cut"] is True


def test_an_anonymous_battle_uses_the_arenas_seconds_cap(settings: Any) -> None:
    settings.ARENA_MAX_REPLY_SECONDS = 50
    quick = LLM.objects.create(name="quick", family="gemma", preset="q", context_tokens=2048, max_reply_seconds=20)
    patient = LLM.objects.create(name="patient", family="gemma", preset="p", context_tokens=2048, max_reply_seconds=90)
    anonymous = services.start_battle(voter_key="voter")
    named = services.start_battle(voter_key="voter", mode=Battle.Mode.NAMED, models=["patient", "quick"])
    # Anonymous: the least cap of the models it may draw, for both sides, whichever they are.
    assert selectors.reply_seconds_cap(anonymous, patient) == selectors.reply_seconds_cap(anonymous, quick) == 20
    # Named: each model's own, within the arena's.
    assert selectors.reply_seconds_cap(named, quick) == 20
    assert selectors.reply_seconds_cap(named, patient) == 50


def test_the_admin_edits_a_models_caps(admin_client: Any) -> None:
    model = LLM.objects.create(name="capped", family="gemma", preset="p", context_tokens=2048)
    page = admin_client.get(f"/admin/inference/llm/{model.pk}/change/").content.decode()
    assert 'name="max_reply_seconds"' in page and 'name="max_new_tokens"' in page
