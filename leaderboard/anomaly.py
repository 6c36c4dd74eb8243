"""Anomalous voters, as the Chatbot Arena paper detects them (Chiang et al. 2024, §5.1). Plain Python.

Each vote is compared with the history of its pair of models, the other voters' votes on that
pair: its p-value is how unusual its outcome is there (two-sided, from the history's empirical
distribution, with one pseudo-observation so that no p-value is 0). A voter's p-values are then
combined with Fisher's method: ``-2 * sum(log p)`` follows a chi-squared distribution with ``2k``
degrees of freedom for ``k`` ordinary votes. A voter with at least ``min_votes`` votes and a
combined p-value below ``alpha`` is anomalous: a vote-stuffer pushing a model that usually
loses, or one that votes against the crowd on purpose. An ordinary voter who sides with an
even pair is not (each such vote has a p-value near 1).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OUTCOMES = (0.0, 0.5, 1.0)  # The second model of the pair won; a tie or both bad; the first won.


@dataclass(frozen=True)
class PairVote:
    """``count`` votes of one voter on one pair (two model names in sorted order), same outcome."""

    voter: str
    pair: tuple[str, str]
    outcome: float
    count: int = 1


@dataclass(frozen=True)
class Anomaly:
    voter: str
    p_value: float  # Fisher's combined p-value of the voter's votes.
    votes: int  # How many of them had a history to be compared with.


def vote_p_value(outcome: float, history: Counter[float]) -> float:
    """Two-sided empirical p-value of ``outcome`` among a pair's other votes."""
    total = sum(history.values())
    at_least = sum(n for value, n in history.items() if value >= outcome)
    at_most = sum(n for value, n in history.items() if value <= outcome)
    one_sided = min(at_least, at_most) + 1
    return min(1.0, 2.0 * one_sided / (total + 1))


def fisher_p_value(p_values: Sequence[float]) -> float:
    """Fisher's combination: P(chi-squared with 2k degrees of freedom >= -2 sum log p)."""
    return _fisher(-sum(math.log(p) for p in p_values), len(p_values))


def _fisher(half: float, k: int) -> float:
    """Survival function at x = 2 * half of chi-squared with 2k degrees of freedom:
    exp(-x/2) * sum over i < k of (x/2)^i / i! (exact for even degrees of freedom)."""
    if k == 0:
        return 1.0
    term, total = 1.0, 1.0
    for i in range(1, k):
        term *= half / i
        total += term
    return min(1.0, math.exp(-half) * total)


def anomalous_voters(
    votes: Iterable[PairVote], *, alpha: float = 1e-4, min_votes: int = 5, min_history: int = 10
) -> list[Anomaly]:
    """Voters whose votes, together, are too unlikely given how everyone else voted."""
    votes = list(votes)
    pair_totals: dict[tuple[str, str], Counter[float]] = defaultdict(Counter)
    own: dict[tuple[str, tuple[str, str]], Counter[float]] = defaultdict(Counter)
    for vote in votes:
        pair_totals[vote.pair][vote.outcome] += vote.count
        own[(vote.voter, vote.pair)][vote.outcome] += vote.count
    minus_log_p: Counter[str] = Counter()  # Per voter: -sum log p over the votes compared.
    compared: Counter[str] = Counter()
    for vote in votes:
        history = pair_totals[vote.pair] - own[(vote.voter, vote.pair)]  # Everyone else's votes.
        if sum(history.values()) >= min_history:
            minus_log_p[vote.voter] -= vote.count * math.log(vote_p_value(vote.outcome, history))
            compared[vote.voter] += vote.count
    found = []
    for voter, count in compared.items():
        if count >= min_votes:
            combined = _fisher(minus_log_p[voter], count)
            if combined < alpha:
                found.append(Anomaly(voter=voter, p_value=combined, votes=count))
    return sorted(found, key=lambda anomaly: anomaly.p_value)


def pair_vote(voter: str, model_a: str, model_b: str, choice: str, count: int = 1) -> PairVote:
    """Votes as the detector sees them: the pair in name order, the outcome for its first model."""
    first_won = (choice == "a") == (model_a <= model_b)
    outcome = 0.5 if choice in ("tie", "both_bad") else float(first_won)
    first, second = sorted((model_a, model_b))
    return PairVote(voter=voter, pair=(first, second), outcome=outcome, count=count)
