"""More ways to use the arena: a named side-by-side battle between two models the voter picks, a
direct chat with one, and a read-only share page for a revealed battle. Named votes are stored
with their mode, exported, and kept off the anonymous leaderboard. Real websockets, a real
Celery worker, PostgreSQL and Redis."""

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from leaderboard import services as leaderboard_services
from votes import research
from votes.models import Battle, Message, Vote

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = {"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"}


async def start(client: Any, **frame: Any) -> dict[str, Any]:
    await client.send({"type": "start", **frame})
    return (await client.receive_until(lambda f: f["type"] in ("state", "error")))[-1]


async def test_a_named_battle_shows_the_picked_models_and_stays_off_the_leaderboard(
    connect_battle, demo_llms, celery_worker
) -> None:
    first, second = (llm.name for llm in demo_llms)
    page = await connect_battle()
    state = await start(page, mode="named", models=[second, first])
    assert state["mode"] == "named" and state["models"] == {"a": second, "b": first}
    assert not state["ended"]

    await page.send(PROMPT)
    await page.receive_both_ends()
    await page.send({"type": "vote", "choice": "b"})
    await page.receive_until(lambda f: f["type"] == "voted")
    await page.send({"type": "end"})
    revealed = (await page.receive_until(lambda f: f["type"] == "revealed"))[-1]
    assert revealed["share"].startswith("/share/")

    battle = await database_sync_to_async(Battle.objects.get)(public_id=state["battle"])
    assert battle.mode == Battle.Mode.NAMED and battle.excluded
    refresh = await database_sync_to_async(leaderboard_services.refresh_leaderboard)()
    overall = await database_sync_to_async(refresh.snapshots.get)(category="overall")
    assert overall.votes == 0 and overall.excluded["identity leak"] == 1

    # Exported with its mode, and with why it does not count.
    def exported() -> list[dict[str, Any]]:
        return [research.vote_record(v, with_exclusion=True) for v in research.all_votes()]

    (record,) = await database_sync_to_async(exported)()
    assert record["mode"] == "named" and record["anony"] is False
    assert record["excluded"] and record["excluded_reason"].startswith("named mode")
    assert (record["model_a"], record["model_b"], record["winner"]) == (second, first, "model_b")


async def test_a_direct_chat_talks_to_one_model_and_takes_no_vote(connect_battle, demo_llms, celery_worker) -> None:
    chosen = demo_llms[1].name
    page = await connect_battle()
    state = await start(page, mode="direct", models=[chosen])
    assert state["mode"] == "direct" and state["models"] == {"a": chosen}
    for text in ("Hello there.", "And again."):  # no vote needed between turns
        await page.send({"type": "prompt", "text": text})
        prompt = (await page.receive_until(lambda f: f["type"] == "prompt"))[-1]
        assert prompt["sides"] == ["a"]
        end = (await page.receive_until(lambda f: f["type"] == "end"))[-1]
        assert end["side"] == "a" and end["status"] == "done"
    await page.send({"type": "vote", "choice": "a"})
    error = (await page.receive_until(lambda f: f["type"] == "error"))[-1]
    assert error["code"] == "no_votes"
    replies = await database_sync_to_async(
        lambda: list(Message.objects.filter(role="assistant").values_list("side", flat=True))
    )()
    assert replies == ["a", "a"]
    assert await database_sync_to_async(Vote.objects.count)() == 0


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"mode": "named", "models": ["only-one"]}, "bad_models"),
        ({"mode": "named", "models": ["same", "same"]}, "bad_models"),
        ({"mode": "named", "models": ["no-such-model", "nor-this"]}, "no_model"),
        ({"mode": "direct", "models": []}, "bad_models"),
        ({"mode": "anonymous", "models": ["picked"]}, "bad_models"),
        ({"mode": "secret"}, "bad_frame"),
        ({"mode": "named", "models": "two"}, "bad_frame"),
    ],
)
async def test_a_bad_pick_is_refused_clearly_and_starts_nothing(connect_battle, demo_llms, frame, code) -> None:
    page = await connect_battle()
    error = await start(page, **frame)
    assert error["type"] == "error" and error["code"] == code and error["message"]
    assert await database_sync_to_async(Battle.objects.count)() == 0


def make_ended_battle(models: list[Any], **fields: Any) -> Battle:
    battle = Battle.objects.create(model_a=models[0], model_b=models[1], voter_key="v", **fields)
    for side in "ab":
        Message.objects.create(battle=battle, side=side, turn=0, role="user", content="Add a meeting with Fred")
        Message.objects.create(
            battle=battle,
            side=side,
            turn=0,
            role="assistant",
            status="done",
            content=f"**Side {side}** <script>alert(1)</script>",
            rating="mistake" if side == "a" else "correct",
        )
    Vote.objects.create(battle=battle, choice="b", stage=Vote.Stage.FIRST_TRY)
    return battle


def test_the_share_page_shows_a_revealed_battle_read_only(demo_llms) -> None:
    from votes import services

    battle = make_ended_battle(demo_llms)
    assert battle.share_id is None
    services.end_battle(battle=battle)
    battle.refresh_from_db()
    html = Client().get(f"/share/{battle.share_id}/").content.decode()
    for shown in (demo_llms[0].name, demo_llms[1].name, "first try: B is better", "🍄 mistake", "✓ correct"):
        assert shown in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "data-markdown>**Side a**" in html
    assert "<form" not in html.split("<main>", 1)[1]  # read-only


def test_a_battle_not_ended_has_no_share_page(demo_llms) -> None:
    battle = make_ended_battle(demo_llms)  # still active
    battle.share_id = "not-yet"
    battle.save()
    response = Client().get("/share/not-yet/")
    assert response.status_code == 404
    assert "can be shared once it has ended" in response.content.decode()
    assert Client().get("/share/nothing-here/").status_code == 404
