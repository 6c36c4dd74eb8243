"""Rating math: Bradley-Terry from pairwise win counts, and online Elo. No Django here.

Models are indices 0..n-1. A tie counts as half a win for each side, as in Chatbot Arena.
"""

from collections.abc import Iterable, Sequence

import numpy as np

ELO_SCALE = 400.0
BASE_RATING = 1000.0

# The score of model A for each vote choice. "Both bad" is a tie: neither side won.
VOTE_SCORES = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}


def win_matrix(n_models: int, games: Iterable[tuple[int, int, float]]) -> np.ndarray:
    """wins[i, j] = how often i beat j, ties counted as half a win for each side."""
    wins = np.zeros((n_models, n_models))
    for a, b, score_a in games:
        if a == b:
            raise ValueError("A model cannot play itself.")
        wins[a, b] += score_a
        wins[b, a] += 1.0 - score_a
    return wins


def bradley_terry(wins: np.ndarray, *, prior: float = 0.5, iterations: int = 1000, tol: float = 1e-10) -> np.ndarray:
    """Bradley-Terry strengths on the Elo scale (mean 1000), fitted by Hunter's MM algorithm.

    `prior` adds that many virtual tied games between every pair of models. It keeps the
    estimate finite for undefeated or disconnected models and pulls thin evidence toward the
    mean, as a small L2 penalty does in a logistic fit.
    """
    n = wins.shape[0]
    if wins.shape != (n, n):
        raise ValueError("wins must be a square matrix.")
    if n == 0:
        return np.zeros(0)
    regularised = wins + (prior / 2.0) * (1.0 - np.eye(n))
    games = regularised + regularised.T
    total_wins = regularised.sum(axis=1)
    strength = np.ones(n)
    for _ in range(iterations):
        pair_sums = strength[:, None] + strength[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            denominators = np.where(games > 0, games / pair_sums, 0.0).sum(axis=1)
        updated = np.where(denominators > 0, total_wins / np.where(denominators > 0, denominators, 1.0), strength)
        updated /= np.exp(np.mean(np.log(np.maximum(updated, 1e-300))))
        if np.max(np.abs(updated - strength)) < tol:
            strength = updated
            break
        strength = updated
    return BASE_RATING + ELO_SCALE * np.log10(strength)


def expected_score(rating_a: float, rating_b: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / ELO_SCALE))


def online_elo(
    n_models: int, games: Sequence[tuple[int, int, float]], *, k: float = 32.0, initial: float = BASE_RATING
) -> np.ndarray:
    """Elo updated game by game in the order given (oldest first)."""
    ratings = np.full(n_models, initial, dtype=float)
    for a, b, score_a in games:
        expected_a = expected_score(ratings[a], ratings[b])
        ratings[a] += k * (score_a - expected_a)
        ratings[b] -= k * (score_a - expected_a)
    return ratings
