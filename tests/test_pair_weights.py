"""Inverse-probability pair weights: the leaderboard weighs each vote by 1 / its pair's chance of
being drawn (recorded on the battle), and what that changes, measured by simulation."""

import random

import numpy as np
import pytest
from django.test import override_settings
from django.utils import timezone

from inference.models import LLM
from leaderboard import ratings
from leaderboard import services as leaderboard_services
from leaderboard.models import LeaderboardSnapshot
from votes import services
from votes.models import Battle, Vote

N_MODELS = 6
VOTES = 20_000


def simulate(seed: int, deviation: float) -> tuple[float, float]:
    """The largest error, in rating points, of the unweighted and the weighted fit against what
    an even draw of pairs would give, on one arena whose pairs are drawn up to 20 times more
    often than others. ``deviation``: how far the true preferences are from Bradley-Terry (a
    pair-specific log-odds shift of that standard deviation: model X beats Y more often than
    their strengths say). Where the truth is Bradley-Terry, every design estimates the same
    ratings; where it is not, the fit depends on which pairs were played."""
    rng = np.random.default_rng(seed)
    strength = rng.normal(0.0, 0.6, N_MODELS)
    first, second = np.triu_indices(N_MODELS, k=1)
    shift = rng.normal(0.0, deviation, first.size)
    p_first = 1.0 / (1.0 + np.exp(-(strength[first] - strength[second] + shift)))
    # The target: the Bradley-Terry fit of the true preferences under an even draw of pairs.
    even = ratings.PairOutcomes(N_MODELS, first, second, 1e6 * p_first, 1e6 * (1.0 - p_first), np.zeros(first.size))
    target = ratings.bradley_terry(even.wins(), prior=0.0)
    # The arena's draw: pair weights spread over a factor of 20 (as active sampling can).
    probability = np.exp(rng.uniform(0.0, np.log(20.0), first.size))
    probability /= probability.sum()
    games = rng.multinomial(VOTES, probability)
    wins = rng.binomial(games, p_first).astype(float)
    drawn = ratings.PairOutcomes(N_MODELS, first, second, wins, games - wins, np.zeros(first.size))
    plain = ratings.bradley_terry(drawn.wins(), prior=0.0)
    weights = ratings.inverse_probability_weights(drawn, probability)
    weighted = ratings.sandwich_intervals(drawn, prior=0.0, pair_weights=weights).ratings
    return float(np.abs(plain - target).max()), float(np.abs(weighted - target).max())


def test_weights_undo_an_uneven_draw_where_preferences_are_not_bradley_terry() -> None:
    errors = np.array([simulate(seed, deviation=0.5) for seed in range(20)])
    plain, weighted = errors.mean(axis=0)
    # Measured (20 arenas of 20,000 votes): unweighted 31.3 points off at worst on average, weighted 8.9.
    assert weighted < plain / 2.5, (plain, weighted)
    assert weighted < 12.0


def test_weights_cost_little_where_preferences_are_bradley_terry() -> None:
    errors = np.array([simulate(seed, deviation=0.0) for seed in range(20)])
    plain, weighted = errors.mean(axis=0)
    # Both estimate the truth; weighting adds some variance (measured: 8.7 against 7.2 points).
    assert plain < 12.0 and weighted < 12.0
    assert weighted < 1.5 * plain, (plain, weighted)


@pytest.mark.django_db
def test_battles_record_their_pair_probability_and_the_board_weighs_by_it() -> None:
    models = [
        LLM.objects.create(name=f"m{i}", family="gemma", preset=f"p{i}", queue=f"q{i}", context_tokens=2048)
        for i in range(3)
    ]
    LLM.objects.filter(pk=models[0].pk).update(sampling_weight=4.0)
    rng = random.Random(5)
    with override_settings(ARENA_PAIR_SAMPLING="weighted", ARENA_NEW_MODEL_BOOST=0.0):
        battles = [services.start_battle(voter_key=f"v{i}", rng=rng) for i in range(60)]
    # Weights 4, 1, 1: the pairs with m0 have weight 4 each, the other 1, of 9 in all.
    expected = {frozenset((models[0].pk, models[1].pk)): 4 / 9, frozenset((models[0].pk, models[2].pk)): 4 / 9}
    for battle in battles:
        pair = frozenset((battle.model_a_id, battle.model_b_id))
        assert battle.pair_probability == pytest.approx(expected.get(pair, 1 / 9))
        Vote.objects.create(battle=battle, choice="a", stage=Vote.Stage.FIRST_TRY)
    Battle.objects.update(state=Battle.State.ENDED, ended=timezone.now())
    leaderboard_services.refresh_leaderboard(rounds=20)
    overall = LeaderboardSnapshot.objects.get(category="overall")
    assert overall.pair_weighted

    # A battle drawn before probabilities were recorded: the board cannot weigh, and says so.
    # (A bulk update sends no signal to the refresh's running counts: this refresh counts again.)
    Battle.objects.filter(pk=battles[0].pk).update(pair_probability=None)
    leaderboard_services.refresh_leaderboard(rounds=20, recount=True)
    assert not LeaderboardSnapshot.objects.filter(category="overall").latest("refresh__created").pair_weighted
