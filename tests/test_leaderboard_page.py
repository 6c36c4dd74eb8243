"""The leaderboard page ranks models from the votes in the database."""

import pytest

from inference.models import LLM
from votes.models import Battle, Vote

pytestmark = pytest.mark.django_db


def make_vote(model_a: LLM, model_b: LLM, choice: str) -> None:
    battle = Battle.objects.create(model_a=model_a, model_b=model_b, voter_key="k", state=Battle.State.ENDED)
    Vote.objects.create(battle=battle, choice=choice)


def test_leaderboard_ranks_by_votes(client) -> None:
    strong, weak, _idle = (
        LLM.objects.create(name=name, family="gemma", preset=f"/presets/{name}") for name in ("strong", "weak", "idle")
    )
    for _ in range(4):
        make_vote(strong, weak, "a")
    make_vote(weak, strong, "b")
    make_vote(weak, strong, "tie")

    response = client.get("/leaderboard/")
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [row.name for row in rows] == ["strong", "idle", "weak"]
    assert [row.votes for row in rows] == [6, 0, 6]
    assert rows[0].bradley_terry > 1000 > rows[2].bradley_terry
    assert rows[0].elo > rows[2].elo
    html = response.content.decode()
    assert html.index("strong") < html.index("weak")


def test_empty_leaderboard(client) -> None:
    response = client.get("/leaderboard/")
    assert response.status_code == 200
    assert "No models yet" in response.content.decode()
