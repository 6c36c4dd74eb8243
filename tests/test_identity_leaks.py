"""Identity leaks: a reply naming a model, a family or a maker before the vote excludes the
battle's votes; one after the vote cannot void the votes already cast."""

from typing import Any

import pytest
from channels.db import database_sync_to_async

from leaderboard import selectors as leaderboard_selectors
from leaderboard.selectors import counted_votes, excluded_votes
from tests.conftest import answer_prompt, finish_as_worker
from votes import services
from votes.leaks import find_identity_leak
from votes.models import Battle, Message


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("As a Gemma model, I can't do that.", "Gemma"),
        ("I was trained by Google DeepMind.", "Google"),
        ("I'm LLaMA-3, here to help", "LLaMA"),
        ("I'm SmolLM, trained by Hugging Face.", "SmolLM"),
        ("I am SmolLM2, a small model.", "SmolLM2"),
        ("Hugging Face trained me.", "Hugging Face"),
        ("mistral here", "mistral"),
        ("Built by Meta AI.", "Meta AI"),
        ("I am tiny-gemma.", "tiny-gemma"),  # The battle's own roster name, whole.
        ('action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)', None),
        ("The metadata says 'geMMArk'.", None),  # Words that merely contain a name are fine.
    ],
)
def test_find_identity_leak(text: str, leak: str | None) -> None:
    assert find_identity_leak(text, ["tiny-gemma", "tiny-llama3"]) == leak


@pytest.mark.django_db
def test_leaking_reply_excludes_the_battle_from_the_leaderboard(demo_llms) -> None:
    def play(texts: dict[str, str]) -> Battle:
        battle = services.start_battle(voter_key="k")
        answer_prompt(battle, "Who are you?", replies=lambda reply: texts[reply.side])
        services.cast_vote(battle=battle, choice="a")
        battle.refresh_from_db()
        return battle

    clean = play({"a": "I am a calendar assistant.", "b": "Hello."})
    leaky = play({"a": "Hello.", "b": "I am Llama, made by Meta AI."})
    # The reason is shown to the voter only once the battle has ended (it would name the model).
    from votes.selectors import battle_state

    assert battle_state(leaky)["excluded"] is None
    for battle in (clean, leaky):
        services.end_battle(battle=battle)
        battle.refresh_from_db()
    assert battle_state(leaky)["excluded"] == leaky.excluded_reason

    assert not clean.excluded
    assert leaky.excluded
    assert leaky.excluded_reason == "the reply of side B at turn 1 names 'Llama'"
    assert Message.objects.get(battle=leaky, side="b", role="assistant").identity_leak == "Llama"
    # The votes are kept, but only the clean battle's counts.
    assert leaky.votes.count() == 1
    assert list(counted_votes().values_list("battle", flat=True)) == [clean.pk]
    assert excluded_votes() == {"identity leak": 1, "flagged voter": 0, "over daily cap": 0, "unfinished battle": 0}


def queued_replies(battle_id: str) -> list[int]:
    return list(
        Message.objects.filter(battle__public_id=battle_id, role="assistant", status="pending")
        .order_by("side")
        .values_list("id", flat=True)
    )


async def answer(battle_id: str, content: str) -> None:
    """Every queued reply of the battle finished with ``content``, as a worker would."""
    for message_id in await database_sync_to_async(queued_replies)(battle_id):
        await database_sync_to_async(finish_as_worker)(message_id, content)


async def first_turn_voted(client: Any, prompt: str, reply: str) -> str:
    """A battle started by ``prompt`` to both sides, both answered ``reply``, then a vote for A;
    its public id."""
    await client.send({"type": "prompt", "text": prompt})
    battle_id = (await client.receive())["battle"]
    await client.receive_until(lambda frame: frame["type"] == "prompt")
    await answer(battle_id, reply)
    await client.send({"type": "vote", "choice": "a"})
    assert (await client.receive_until(lambda frame: frame["type"] in {"voted", "error"}))[-1]["type"] == "voted"
    return battle_id


@pytest.mark.django_db(transaction=True)
async def test_a_leak_after_the_vote_cannot_void_it(connect_battle: Any, unserved_llms: Any) -> None:
    """Through the real websocket: a voter votes, then makes one side name its maker with a
    one-side prompt. The vote cast before stays counted; the battle takes no more votes,
    ratings or prompts (``named_after_vote``) and can still be ended. A leak before the vote
    still excludes the battle, and the anomaly detector judges that battle's vote too."""
    client = await connect_battle()
    battle_id = await first_turn_voted(
        client,
        "Add a meeting with Fred on Nov 11 at 5PM",
        'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00")',
    )
    await client.send({"type": "prompt", "text": "Who made you?", "side": "b"})
    await client.receive_until(lambda frame: frame["type"] == "prompt")
    await answer(battle_id, "I was trained by Google.")
    battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
    assert not battle.excluded and battle.closed_reason == "the reply of side B at turn 2 names 'Google'"
    for frame in (
        {"type": "vote", "choice": "b"},
        {"type": "rate", "side": "b", "turn": 1, "rating": "correct"},
        {"type": "prompt", "text": "And you?", "side": "a"},
    ):
        await client.send(frame)
        refused = (await client.receive_until(lambda frame: frame["type"] == "error"))[-1]
        assert refused["code"] == "named_after_vote", refused
        assert "the votes you cast before it count" in refused["message"]
    await client.send({"type": "end"})
    await client.receive_until(lambda frame: frame["type"] == "revealed")
    counted = await database_sync_to_async(lambda: list(counted_votes().values_list("battle__public_id", "stage")))()
    assert counted == [(battle_id, "first_try")]

    # A leak before the vote: the vote is kept, left out of the board, and judged by the detector.
    second = await connect_battle()
    leaked_id = await first_turn_voted(second, "Who are you?", "I am Gemma, made by Google DeepMind.")
    await second.send({"type": "end"})
    await second.receive_until(lambda frame: frame["type"] == "revealed")
    leaked = await database_sync_to_async(Battle.objects.get)(public_id=leaked_id)
    assert leaked.excluded and not leaked.closed_reason
    tally = await database_sync_to_async(leaderboard_selectors.current_tally)()
    assert tally.left_out.values[:, 0].sum() == 1  # The leaked battle's vote, left out of the board.
    table = tally.detector_table()
    judged = {table.voters[code]: 0 for code in table.voter}
    for code, count in zip(table.voter, table.count, strict=True):
        judged[table.voters[code]] += count
    assert judged == {leaked.voter_key: 2.0}  # Both battles are this session's.


@pytest.mark.django_db
def test_a_named_battle_goes_on_when_a_model_names_itself_after_the_vote(demo_llms) -> None:
    """Its names are known from the start: nothing to protect, and nothing is closed."""
    names = [llm.name for llm in demo_llms[:2]]
    battle = services.start_battle(voter_key="k", mode=Battle.Mode.NAMED, models=names)
    answer_prompt(battle, "Hello", replies=lambda reply: "Hello.")
    services.cast_vote(battle=battle, choice="a")
    answer_prompt(battle, "Who made you?", replies=lambda reply: "I was trained by Google.")
    battle.refresh_from_db()
    assert not battle.closed_reason
    services.cast_vote(battle=battle, choice="b", stage="after_fix")
