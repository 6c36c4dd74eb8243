"""Which two models a new battle pits against each other. Plain Python, no Django.

Every unordered pair of distinct candidates gets a weight and one pair is drawn by weight; the
sides are then shuffled. A model never meets itself.

* **weighted** (default): the product of the two models' admin-set sampling weights, each times
  a boost for new models: ``1 + new_model_boost`` for a model with no battles yet, fading
  linearly to 1 at ``new_model_battles`` battles, so that a newcomer's rating settles quickly.
* **active**: that weight times how much one more vote on the pair would shrink the uncertainty
  of its win rate, as the Chatbot Arena paper's active sampling does (Chiang et al. 2024, §5.2):
  for a pair with ``n`` votes and estimated win probability ``p``, ``sqrt(v / n) - sqrt(v / (n +
  1))`` with ``v = p (1 - p)``; a pair never compared counts as ``n = 1/2``. Rarely compared
  pairs, and pairs of models close in rating, are drawn more often.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POLICIES = ("weighted", "active")


@dataclass(frozen=True)
class Candidate:
    """A model that can be drawn: its id, admin weight, battles so far and rating (Elo scale)."""

    id: int
    weight: float
    battles: int = 0
    rating: float | None = None


def new_model_factor(battles: int, *, boost: float, settle_battles: int) -> float:
    """``1 + boost`` for a model with no battles, down to 1 at ``settle_battles`` battles."""
    if settle_battles <= 0 or boost <= 0:
        return 1.0
    return 1.0 + boost * max(0.0, 1.0 - battles / settle_battles)


def win_probability(rating_a: float | None, rating_b: float | None) -> float:
    """Bradley-Terry win probability of a over b on the Elo scale (0.5 without ratings)."""
    if rating_a is None or rating_b is None:
        return 0.5
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


def uncertainty_reduction(votes: int, p: float) -> float:
    """How much one more vote shrinks the standard error of the pair's win-rate estimate."""
    variance = max(p * (1.0 - p), 1e-6)
    n = votes if votes > 0 else 0.5
    return math.sqrt(variance / n) - math.sqrt(variance / (n + 1))


def pair_weights(
    candidates: Sequence[Candidate],
    *,
    policy: str = "weighted",
    pair_votes: Mapping[frozenset[int], int] | None = None,
    new_model_boost: float = 0.0,
    new_model_battles: int = 0,
) -> dict[tuple[int, int], float]:
    """The weight of every unordered pair (ids in ascending order) of distinct candidates."""
    if policy not in POLICIES:
        raise ValueError(f"Unknown pair sampling policy {policy!r}; expected one of {POLICIES}.")
    factor = {
        c.id: c.weight * new_model_factor(c.battles, boost=new_model_boost, settle_battles=new_model_battles)
        for c in candidates
    }
    by_id = {c.id: c for c in candidates}
    weights = {}
    ids = sorted(by_id)
    for index, a in enumerate(ids):
        for b in ids[index + 1 :]:
            weight = factor[a] * factor[b]
            if policy == "active":
                votes = (pair_votes or {}).get(frozenset((a, b)), 0)
                weight *= uncertainty_reduction(votes, win_probability(by_id[a].rating, by_id[b].rating))
            if weight > 0:
                weights[(a, b)] = weight
    return weights


def draw_pair(weights: Mapping[tuple[int, int], float], rng: random.Random) -> tuple[int, int]:
    """One pair by weight, sides shuffled: (model on side a, model on side b)."""
    if not weights:
        raise ValueError("No pair of distinct models has a positive weight.")
    pairs = list(weights)
    first, second = rng.choices(pairs, weights=[weights[p] for p in pairs])[0]
    return (first, second) if rng.random() < 0.5 else (second, first)
