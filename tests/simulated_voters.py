"""Simulated voters with a known truth, shared by the tests of the anomaly detection
(test_anomalous_voters) and of voter identity by network (test_network_identity).

A vote is a row ``(voter key, network key, model A, model B, choice)``."""

import random
from collections.abc import Callable, Sequence

import numpy as np
from django.utils import timezone

from inference.models import LLM
from leaderboard import ratings
from votes.models import Battle, Vote

VoteRow = tuple[str, str, str, str, str]

STRONG, WEAK, MEDIUM = "gemma-calendar", "llama3-calendar", "mistral-calendar"


def bradley_terry_votes(
    rng: np.random.Generator,
    true: np.ndarray,
    names: Sequence[str],
    *,
    voters: int,
    per_voter: int,
    network: Callable[[int], str] = lambda voter: "",
) -> list[VoteRow]:
    """``voters`` honest voters (``network(voter)`` each), ``per_voter`` votes each on random
    pairs, outcomes drawn from Bradley-Terry with the ``true`` ratings, 10% ties."""
    rows = []
    for voter in range(voters):
        voter_network = network(voter)
        for _ in range(per_voter):
            a, b = rng.choice(len(true), 2, replace=False)
            p_a = 1.0 / (1.0 + 10.0 ** ((true[b] - true[a]) / 400.0))
            choice = "tie" if rng.random() < 0.1 else ("a" if rng.random() < p_a else "b")
            rows.append((f"honest-{voter}", voter_network, names[a], names[b], choice))
    return rows


def honest_votes(
    rng: random.Random, voters: int, per_voter: int, network: Callable[[int], str] = lambda voter: ""
) -> list[VoteRow]:
    """Three models: the strong one wins 90 % of its battles with the weak one and 60 % with the
    medium one; sides at random."""
    votes = []
    for v in range(voters):
        for _ in range(per_voter):
            other = rng.choice((WEAK, MEDIUM))
            strong_wins = rng.random() < (0.9 if other == WEAK else 0.6)
            a, b = (STRONG, other) if rng.random() < 0.5 else (other, STRONG)
            winner = STRONG if strong_wins else other
            choice = "tie" if rng.random() < 0.1 else ("a" if a == winner else "b")
            votes.append((f"honest-{v}", network(v), a, b, choice))
    return votes


def board_of(names: list[str], rows: Sequence[VoteRow]) -> ratings.RatingsWithIntervals:
    """Ratings with sandwich intervals of the rows' votes."""
    index = {name: i for i, name in enumerate(names)}
    games = [(index[a], index[b], ratings.VOTE_SCORES[choice]) for *_, a, b, choice in rows]
    return ratings.sandwich_intervals(ratings.PairOutcomes.from_games(len(names), games))


def store_votes(rows: Sequence[VoteRow], models: dict[str, LLM]) -> None:
    """The rows as ended battles with one first-try vote each."""
    now = timezone.now()
    battles = Battle.objects.bulk_create(
        Battle(
            model_a=models[a],
            model_b=models[b],
            voter_key=voter,
            network_key=network,
            state=Battle.State.ENDED,
            ended=now,
        )
        for voter, network, a, b, _ in rows
    )
    Vote.objects.bulk_create(
        Vote(battle=battle, choice=row[-1], stage=Vote.Stage.FIRST_TRY)
        for battle, row in zip(battles, rows, strict=True)
    )
