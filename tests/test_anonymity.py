"""Model names never reach the browser before the vote; the vote reveals them."""

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from tests.conftest import new_session
from votes.models import Battle, Vote

pytestmark = pytest.mark.django_db(transaction=True)


def assert_no_names(texts: list[str], names: list[str]) -> None:
    for text in texts:
        for name in names:
            assert name.lower() not in text.lower(), f"model name {name!r} leaked before the vote: {text[:200]}"


async def test_names_hidden_until_vote_then_revealed(connect_battle, demo_llms, celery_worker, voter_session) -> None:
    names = [llm.name for llm in demo_llms]
    names += [llm.family for llm in demo_llms] + [llm.queue for llm in demo_llms]
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Paul on the next day at 8am. 1/2h."})
    battle_id = (await client.receive())["battle"]
    await client.receive_both_ends()

    # The page for the battle, fetched with the voter's own session, and a reconnect's state.
    http = Client()
    http.cookies["sessionid"] = voter_session.session_key
    page = await database_sync_to_async(http.get)(f"/battle/{battle_id}/")
    assert page.status_code == 200
    home = await database_sync_to_async(http.get)("/")
    again = await connect_battle(battle_id)
    before = await again.receive()
    assert_no_names(client.raw + again.raw + [page.content.decode(), home.content.decode()], names)
    # Nor their speed or token counts: the replies' stats wait for the reveal too.
    assert [reply["stats"] for reply in before["turns"][0]["replies"].values()] == [{}, {}]

    # A vote does not reveal the models: the voter may still correct a side and vote again.
    await client.send({"type": "vote", "choice": "a"})
    assert await client.receive() == {"type": "voted", "stage": "first_try", "choice": "a", "after_turn": 0}
    assert_no_names(client.raw, names)

    await client.send({"type": "end"})
    revealed = await client.receive()
    battle = await database_sync_to_async(Battle.objects.select_related("model_a", "model_b").get)(public_id=battle_id)
    assert revealed["type"] == "revealed"
    assert revealed["models"] == {"a": battle.model_a.name, "b": battle.model_b.name}
    assert revealed["votes"] == {"first_try": "a"} and revealed["ended"] is True
    for reply in revealed["turns"][0]["replies"].values():
        assert reply["stats"]["tokens"] > 0 and reply["stats"]["ttft_ms"] is not None
    # Every connection to the battle is told, and a reconnect after the end shows the names.
    assert (await again.receive())["type"] == "voted"
    assert (await again.receive())["type"] == "revealed"
    vote = await database_sync_to_async(Vote.objects.get)(battle=battle)
    assert vote.choice == "a" and battle.state == Battle.State.ENDED
    late = await connect_battle(battle_id)
    state = await late.receive()
    assert state["models"] == {"a": battle.model_a.name, "b": battle.model_b.name}
    assert state["votes"] == {"first_try": "a"}


async def test_other_voters_cannot_open_a_battle(connect_battle, demo_llms, celery_worker) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Cancel the meeting with Fred."})
    battle_id = (await client.receive())["battle"]
    await client.receive_both_ends()

    stranger = Client()
    assert (await database_sync_to_async(stranger.get)(f"/battle/{battle_id}/")).status_code == 404
    stranger_session = await database_sync_to_async(new_session)()
    intruder = await connect_battle(battle_id, session=stranger_session)
    refused = await intruder.receive()
    assert refused["type"] == "error" and refused["code"] == "not_found"
    assert battle_id not in refused["message"]
