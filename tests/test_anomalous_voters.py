"""Anomalous-voter detection (leaderboard/anomaly.py) and the flags it sets, reviewed in admin."""

import math
import random
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from inference.models import LLM
from leaderboard import selectors, services
from leaderboard.anomaly import PairVote, anomalous_voters, fisher_p_value, pair_vote, vote_p_value
from votes.models import Battle, FlaggedVoter, Vote

STRONG, WEAK, MEDIUM = "gemma-calendar", "llama3-calendar", "mistral-calendar"


def honest_votes(rng: random.Random, voters: int, per_voter: int) -> list[tuple[str, str, str, str]]:
    """(voter, model_a, model_b, choice): the strong model wins 90 % of its battles with the weak
    one and 60 % with the medium one; sides at random."""
    votes = []
    for v in range(voters):
        for _ in range(per_voter):
            other = rng.choice((WEAK, MEDIUM))
            strong_wins = rng.random() < (0.9 if other == WEAK else 0.6)
            a, b = (STRONG, other) if rng.random() < 0.5 else (other, STRONG)
            winner = STRONG if strong_wins else other
            choice = "tie" if rng.random() < 0.1 else ("a" if a == winner else "b")
            votes.append((f"honest-{v}", a, b, choice))
    return votes


def stuffing_votes(voter: str, count: int) -> list[tuple[str, str, str, str]]:
    """A vote-stuffer pushing the weak model against the strong one, every time. Against this
    history (the weak model wins 9 % of the votes), 80 such votes are caught in 39 of 40 seeded
    simulations, 50 in about two thirds; no honest voter was flagged in any of them."""
    return [(voter, WEAK, STRONG, "a") if i % 2 else (voter, STRONG, WEAK, "b") for i in range(count)]


def test_p_values() -> None:
    history = Counter({1.0: 90, 0.0: 10})
    assert vote_p_value(1.0, history) == 1.0  # The usual outcome is not evidence of anything.
    assert vote_p_value(0.0, history) == pytest.approx(2 * 11 / 101)
    assert fisher_p_value([1.0, 1.0, 1.0]) == 1.0
    assert fisher_p_value([0.05]) == pytest.approx(0.05)
    # Two p-values of 0.1: -2 sum log p = 9.21 on 4 degrees of freedom.
    x = -2 * 2 * math.log(0.1)
    assert fisher_p_value([0.1, 0.1]) == pytest.approx(math.exp(-x / 2) * (1 + x / 2))


def test_orientation_of_a_vote() -> None:
    assert pair_vote("v", WEAK, STRONG, "a") == PairVote("v", (STRONG, WEAK), 0.0)
    assert pair_vote("v", STRONG, WEAK, "a") == PairVote("v", (STRONG, WEAK), 1.0)
    assert pair_vote("v", WEAK, STRONG, "both_bad").outcome == 0.5


def test_a_simulated_vote_stuffing_attack_is_caught_and_honest_voters_are_not() -> None:
    rng = random.Random(7)
    rows = honest_votes(rng, voters=300, per_voter=4) + stuffing_votes("stuffer", 80)
    found = anomalous_voters(pair_vote(*row) for row in rows)
    assert [a.voter for a in found] == ["stuffer"]
    assert found[0].p_value < 1e-4 and found[0].votes == 80


def test_a_voter_with_few_votes_is_not_judged() -> None:
    rng = random.Random(8)
    rows = honest_votes(rng, voters=100, per_voter=3) + stuffing_votes("newcomer", 4)
    assert anomalous_voters([pair_vote(*row) for row in rows], min_votes=5) == []


@pytest.mark.django_db
def test_refresh_flags_the_stuffer_excludes_their_votes_and_an_admin_can_clear_it(client) -> None:
    models = {
        name: LLM.objects.create(name=name, family="gemma", preset=name, queue=f"q.{name}")
        for name in (STRONG, WEAK, MEDIUM)
    }
    rng = random.Random(9)
    rows = honest_votes(rng, voters=300, per_voter=4) + stuffing_votes("stuffer", 80)
    now = timezone.now()
    battles = Battle.objects.bulk_create(
        Battle(model_a=models[a], model_b=models[b], voter_key=voter, state=Battle.State.ENDED, ended=now)
        for voter, a, b, _ in rows
    )
    Vote.objects.bulk_create(
        Vote(battle=battle, choice=choice, stage=Vote.Stage.FIRST_TRY)
        for battle, (_, _, _, choice) in zip(battles, rows, strict=True)
    )

    services.refresh_leaderboard(rounds=20)
    flag = FlaggedVoter.objects.get()
    assert flag.voter_key == "stuffer" and flag.source == FlaggedVoter.Source.AUTOMATIC
    assert flag.reason.startswith("anomalous votes: Fisher's p = ") and flag.p_value < 1e-4
    assert selectors.excluded_votes()["flagged voter"] == 80
    assert selectors.counted_votes().count() == len(rows) - 80

    # Reviewed in admin and cleared: the votes count again, and the next refresh leaves it.
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "a-long-password-9")
    client.force_login(admin)
    response = client.post(
        "/admin/votes/flaggedvoter/", {"action": "clear_flags", "_selected_action": [flag.pk]}, follow=True
    )
    assert response.status_code == 200
    flag.refresh_from_db()
    assert flag.cleared
    assert selectors.excluded_votes()["flagged voter"] == 0
    services.refresh_leaderboard(rounds=20)
    assert FlaggedVoter.objects.count() == 1 and FlaggedVoter.objects.get().cleared
