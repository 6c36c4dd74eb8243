"""The leaderboard as read from the votes so far."""

from dataclasses import dataclass

from django.db.models import Count, QuerySet

from inference.models import LLM
from leaderboard import ratings
from votes.models import Vote


@dataclass(frozen=True)
class LeaderboardRow:
    rank: int
    name: str
    bradley_terry: float
    elo: float
    votes: int
    wins: float


def counted_votes(stage: str = Vote.Stage.FIRST_TRY) -> "QuerySet[Vote]":
    """The votes the leaderboard counts: one stage, battles excluded for an identity leak left out."""
    return Vote.objects.filter(stage=stage, battle__excluded=False)


def leaderboard_rows() -> list[LeaderboardRow]:
    """Models ranked by Bradley-Terry; the database aggregates votes into pairwise counts."""
    models = list(LLM.objects.order_by("name"))
    index = {model.pk: i for i, model in enumerate(models)}
    counts = counted_votes().values("battle__model_a", "battle__model_b", "choice").annotate(n=Count("id")).order_by()
    wins = ratings.win_matrix(len(models), [])
    for row in counts:
        a, b = index[row["battle__model_a"]], index[row["battle__model_b"]]
        score_a = ratings.VOTE_SCORES[row["choice"]]
        wins[a, b] += score_a * row["n"]
        wins[b, a] += (1.0 - score_a) * row["n"]
    # Elo depends on the order of the votes, so it reads them one by one (oldest first).
    history = counted_votes().order_by("created", "pk").values_list("battle__model_a", "battle__model_b", "choice")
    games = [(index[a], index[b], ratings.VOTE_SCORES[choice]) for a, b, choice in history]
    bt = ratings.bradley_terry(wins)
    elo = ratings.online_elo(len(models), games)
    played = wins + wins.T
    order = sorted(range(len(models)), key=lambda i: (-bt[i], models[i].name))
    return [
        LeaderboardRow(
            rank=rank,
            name=models[i].name,
            bradley_terry=round(float(bt[i]), 1),
            elo=round(float(elo[i]), 1),
            votes=round(float(played[i].sum())),
            wins=float(wins[i].sum()),
        )
        for rank, i in enumerate(order, start=1)
    ]
