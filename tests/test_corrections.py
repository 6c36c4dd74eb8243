"""Mistake-fixing battles over the websocket: a task battle, a correction to one side only (the
other stays paused), ratings, staged votes, regenerate, and the checks shown at the end."""

import pytest
from channels.db import database_sync_to_async

from votes import selectors, services
from votes.management.commands.import_tasks import BUNDLED_TASKS
from votes.models import Battle, Message, Task, Vote

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = "Add a meeting with Fred on Nov 11 at 5PM"
CORRECTION = "The current year is 2024."


@pytest.fixture
def calendar_task(transactional_db) -> Task:
    import json

    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    return Task.objects.get(slug="calendar")


def side_history(battle_id: str, side: str) -> list[tuple[int, str, str, str]]:
    return list(
        Message.objects.filter(battle__public_id=battle_id, side=side)
        .order_by("turn", "-role")
        .values_list("turn", "role", "content", "status")
    )


async def test_task_battle_one_side_correction_ratings_votes_and_reveal(
    connect_battle, demo_llms, celery_worker, calendar_task
) -> None:
    client = await connect_battle()
    await client.send({"type": "start", "task": "calendar"})
    battle_id = (await client.receive())["battle"]
    state = await client.receive()
    assert state["task"]["system_prompt"] == calendar_task.system_prompt
    assert state["task"]["suggestions"][:2] == [FIRST, CORRECTION]

    # Turn 0 goes to both sides, and each reply is generated with the task's system prompt.
    await client.send({"type": "prompt", "text": FIRST})
    assert (await client.receive())["sides"] == ["a", "b"]
    await client.receive_both_ends()
    battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
    reply_a = await database_sync_to_async(Message.objects.get)(battle=battle, side="a", turn=0, role="assistant")
    context = await database_sync_to_async(selectors.generation_context)(reply_a.pk)
    assert context.system_prompt == calendar_task.system_prompt
    assert reply_a.script_turn == 0

    # A correction needs the first-try vote first; 🥦 needs a wrong reply before it.
    await client.send({"type": "prompt", "text": CORRECTION, "side": "a"})
    assert (await client.receive())["code"] == "vote_first"
    await client.send({"type": "rate", "side": "a", "turn": 0, "rating": "fixed"})
    assert (await client.receive())["code"] == "not_a_fix"
    await client.send({"type": "rate", "side": "a", "turn": 0, "rating": "mistake"})
    assert await client.receive() == {"type": "rated", "side": "a", "turn": 0, "rating": "mistake"}
    await client.send({"type": "rate", "side": "b", "turn": 0, "rating": "garbage"})
    assert (await client.receive())["type"] == "rated"
    await client.send({"type": "vote", "choice": "a"})
    assert (await client.receive())["stage"] == "first_try"
    # Nothing was corrected yet: no "after fix" vote, and turn 0 can't be regenerated (voted).
    await client.send({"type": "vote", "choice": "a"})
    assert (await client.receive())["code"] == "not_ready"
    await client.send({"type": "regenerate", "side": "b"})
    assert (await client.receive())["code"] == "already_voted"

    # The correction goes to side A only: side B is paused, receives nothing, keeps its history.
    history_b = await database_sync_to_async(side_history)(battle_id, "b")
    await client.send({"type": "prompt", "text": CORRECTION, "side": "a"})
    prompt = await client.receive()
    # A scripted correction to side A alone: its answer can be 🥦 should A's reply be judged wrong.
    assert prompt == {"type": "prompt", "turn": 1, "text": CORRECTION, "sides": ["a"], "corrects": ["a"]}
    frames = await client.receive_until(lambda f: f["type"] == "end")
    assert frames[-1]["side"] == "a" and frames[-1]["turn"] == 1
    assert all(f.get("side") == "a" for f in frames)
    await client.assert_silent()
    assert await database_sync_to_async(side_history)(battle_id, "b") == history_b
    reply_a1 = await database_sync_to_async(Message.objects.get)(battle=battle, side="a", turn=1, role="assistant")
    assert reply_a1.script_turn == 1  # The scripted correction: checked against its own expectation.
    history_a = await database_sync_to_async(side_history)(battle_id, "a")
    assert [(turn, role) for turn, role, _, _ in history_a] == [
        (0, "user"),
        (0, "assistant"),
        (1, "user"),
        (1, "assistant"),
    ]

    # Regenerate side A's correction reply (not voted on yet): a fresh reply replaces it.
    await client.send({"type": "regenerate", "side": "a"})
    assert await client.receive() == {"type": "regenerating", "side": "a", "turn": 1}
    frames = await client.receive_until(lambda f: f["type"] == "end")
    assert frames[-1]["status"] == "done"
    await client.assert_silent()
    reply_a1 = await database_sync_to_async(Message.objects.get)(pk=reply_a1.pk)
    assert reply_a1.regenerations == 1 and reply_a1.content == frames[-1]["text"]

    # 🥦 now fits side A's reply to the correction; then the after-fix vote and the end.
    await client.send({"type": "rate", "side": "a", "turn": 1, "rating": "fixed"})
    assert (await client.receive())["rating"] == "fixed"
    await client.send({"type": "vote", "choice": "tie"})
    assert (await client.receive())["stage"] == "after_fix"
    votes = await database_sync_to_async(lambda: {v.stage: (v.choice, v.after_turn) for v in battle.votes.all()})()
    assert votes == {"first_try": ("a", 0), "after_fix": ("tie", 1)}
    await client.send({"type": "end"})
    revealed = await client.receive()
    assert revealed["type"] == "revealed" and set(revealed["models"]) == {"a", "b"}
    # The automatic checks are shown now, beside the voter's ratings (random tiny models: wrong).
    turn0 = revealed["turns"][0]["replies"]
    assert turn0["a"]["rating"] == "mistake" and turn0["b"]["rating"] == "garbage"
    for reply in (turn0["a"], turn0["b"], revealed["turns"][1]["replies"]["a"]):
        assert reply["check"]["verdict"] in ("mistake", "garbage") and reply["check"]["reason"]
    assert revealed["turns"][1]["sides"] == ["a"] and "b" not in revealed["turns"][1]["replies"]
    await client.send({"type": "rate", "side": "a", "turn": 0, "rating": "correct"})
    assert (await client.receive())["code"] == "battle_closed"


async def test_only_a_prompt_to_one_side_after_its_mistake_is_a_correction(
    connect_battle, demo_llms, celery_worker
) -> None:
    """Free chat, as a voter tried it: 🍄 on one side, then a new question to both sides. That is
    no correction and its answer no fix (🥦 refused, no episode, no "preference after
    correction"); a correction sent to that side alone afterwards is exactly one episode."""
    from leaderboard.selectors import AFTER_CORRECTION, in_category

    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    battle_id = (await client.receive())["battle"]
    assert (await client.receive())["corrects"] == []
    await client.receive_both_ends()
    await client.send({"type": "rate", "side": "a", "turn": 0, "rating": "mistake"})
    assert (await client.receive())["type"] == "rated"
    await client.send({"type": "vote", "choice": "b"})
    assert (await client.receive())["stage"] == "first_try"

    await client.send({"type": "prompt", "text": "Explain photosynthesis in two sentences."})
    assert await client.receive() == {
        "type": "prompt",
        "turn": 1,
        "text": "Explain photosynthesis in two sentences.",
        "sides": ["a", "b"],
        "corrects": [],
    }
    await client.receive_both_ends()
    await client.send({"type": "rate", "side": "a", "turn": 1, "rating": "fixed"})
    assert (await client.receive())["code"] == "not_a_fix"
    await client.send({"type": "rate", "side": "a", "turn": 1, "rating": "mistake"})
    assert (await client.receive())["type"] == "rated"
    battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
    ours = Battle.objects.filter(pk=battle.pk)
    assert await database_sync_to_async(selectors.fix_episodes)(ours) == []

    # Now the voter tells side A alone what it got wrong, while B waits.
    await client.send({"type": "prompt", "text": "That's wrong, try again.", "side": "a"})
    prompt = await client.receive()
    assert (prompt["sides"], prompt["corrects"]) == (["a"], ["a"])
    await client.receive_until(lambda f: f["type"] == "end")
    await client.send({"type": "rate", "side": "a", "turn": 2, "rating": "fixed"})
    assert (await client.receive())["rating"] == "fixed"
    await client.send({"type": "vote", "choice": "a"})
    assert (await client.receive())["stage"] == "after_fix"
    await client.send({"type": "end"})
    state = await client.receive()
    assert [turn["corrects"] for turn in state["turns"]] == [[], [], ["a"]]

    def episodes_and_votes() -> tuple[list[tuple], list[str]]:
        services.record_fix_episodes(battle_ids=[battle.pk])
        stored = battle.fix_episodes.values_list("side", "wrong_turn", "attempt", "source", "correction", "fixed")
        after = in_category(Vote.objects.filter(battle=battle), AFTER_CORRECTION).values_list("stage", flat=True)
        return list(stored), list(after)

    assert await database_sync_to_async(episodes_and_votes)() == (
        [("a", 1, 1, "voter", "That's wrong, try again.", True)],
        ["after_fix"],
    )


async def test_checks_are_hidden_until_the_end(connect_battle, demo_llms, celery_worker, calendar_task) -> None:
    client = await connect_battle()
    await client.send({"type": "start", "task": "calendar"})
    battle_id = (await client.receive())["battle"]
    await client.receive()
    await client.send({"type": "prompt", "text": FIRST})
    await client.receive_both_ends()
    again = await connect_battle(battle_id)
    state = await again.receive()
    for reply in state["turns"][0]["replies"].values():
        assert "check" not in reply
    saved = await database_sync_to_async(list)(Message.objects.filter(battle__public_id=battle_id, role="assistant"))
    assert all(message.check_verdict for message in saved)  # Stored, just not shown yet.
    for frame in client.raw + again.raw:
        assert '"check":' not in frame and "check_verdict" not in frame


def test_rating_rules_without_a_socket(demo_llms, calendar_task) -> None:
    battle = services.start_battle(voter_key="k", task=calendar_task)
    submitted = services.submit_prompt(battle=battle, text=FIRST)
    with pytest.raises(services.ArenaError, match="Only a finished reply"):
        services.rate_reply(battle=battle, side="a", turn=0, rating="correct")
    for job in submitted.jobs:
        services.claim_reply(job.message_id)
        services.finish_reply(
            job.message_id,
            status=Message.Status.DONE,
            content='action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)',
            delta_count=1,
            stop_reason="stop",
            token_count=20,
            time_to_first_token_ms=5,
            duration_ms=50,
        )
    replies = Message.objects.filter(battle=battle, role="assistant")
    assert {(m.check_verdict, m.check_reason) for m in replies} == {("correct", "")}
    with pytest.raises(services.ArenaError, match="no reply on side B at turn 3"):
        services.rate_reply(battle=battle, side="b", turn=2, rating="correct")
    assert services.rate_reply(battle=battle, side="a", turn=0, rating="correct").rating == "correct"
    assert services.rate_reply(battle=battle, side="a", turn=0, rating=None).rating == ""
    vote = services.cast_vote(battle=battle, choice="tie")
    assert (vote.stage, vote.after_turn) == (Vote.Stage.FIRST_TRY, 0)
    with pytest.raises(services.ArenaError, match="first try"):
        services.cast_vote(battle=battle, choice="a", stage="first_try")
    assert services.end_battle(battle=battle).reveal() is not None
