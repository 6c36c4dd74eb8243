"""Anomalous voters, as the Chatbot Arena paper detects them (Chiang et al. 2024, §5.1), and vote
stuffers. No Django.

Each vote is compared with the history of its pair of models, the other voters' votes on that
pair: its p-value is how unusual its outcome is there (two-sided, from the history's empirical
distribution, with one pseudo-observation so that no p-value is 0). A voter's p-values are then
combined with Fisher's method: ``-2 * sum(log p)`` follows a chi-squared distribution with ``2k``
degrees of freedom for ``k`` ordinary votes. A voter with at least ``min_votes`` votes and a
combined p-value below ``alpha`` is anomalous: a vote-stuffer pushing a model that usually
loses, or one that votes against the crowd on purpose. An ordinary voter who sides with an
even pair is not (each such vote has a p-value near 1).

That test alone misses coordinated stuffing: each vote is compared with everyone else's votes on
its pair, the other stuffers' included, and a few dozen of them make their own outcome look
ordinary (simulated: 25 stuffers casting 5% of the votes for one model, none caught). The
**concentration test** (``concentrated_voters``) looks at which model each vote chose instead.
Pairs are drawn at random, so an honest voter's votes choose each model about as often as
everyone else's do; a stuffer votes only where its target appears, and picks it every time. For
each voter and model, the binomial tail P(X >= c) of choosing that model c times in the voter's
n decisive votes, at the share of the other voters' decisive votes that chose it, is multiplied
by the number of models (Bonferroni: the voter's most chosen model is the one tested). Other
stuffers raise that share, but not nearly enough to hide a run of choices of one model.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

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
    p_value: float  # The test's p-value for the voter's votes.
    votes: int  # How many of them the test judged.
    test: str = "fisher"  # "fisher" (against each pair's history) or "concentration".

    def reason(self) -> str:
        """What an admin reads in the flag."""
        if self.test == "concentration":
            return f"votes concentrated on one model: p = {self.p_value:.1e} over {self.votes} votes"
        return f"anomalous votes: Fisher's p = {self.p_value:.1e} over {self.votes} votes"


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


def concentrated_voters(votes: Iterable[PairVote], *, alpha: float = 1e-4, min_votes: int = 5) -> list[Anomaly]:
    """Voters who chose one model far more often than the other voters do (module docstring)."""
    chosen: dict[str, Counter[str]] = defaultdict(Counter)  # Per voter: decisive votes per model chosen.
    models: set[str] = set()
    for vote in votes:
        models.update(vote.pair)
        if vote.outcome != 0.5:
            chosen[vote.voter][vote.pair[0] if vote.outcome == 1.0 else vote.pair[1]] += vote.count
    everyone: Counter[str] = Counter()
    for counts in chosen.values():
        everyone.update(counts)
    total = sum(everyone.values())
    judged = [(voter, counts, sum(counts.values())) for voter, counts in chosen.items()]
    judged = [(voter, counts, own) for voter, counts, own in judged if own >= min_votes and total > own]
    # One row per (voter, model chosen): all the binomial tails in one vectorised call.
    rows = [
        (index, count, own, everyone[model] - count, total - own)
        for index, (_, counts, own) in enumerate(judged)
        for model, count in counts.items()
    ]
    if not rows:
        return []
    index, count, own, others_chose, others = (np.array(column) for column in zip(*rows, strict=True))
    # The other voters' share, with one pseudo-vote so that a model nobody else chose does not
    # make any choice of it infinitely unlikely.
    tails = binom.sf(count - 1, own, (others_chose + 1) / (others + 1))
    worst = np.ones(len(judged))
    np.minimum.at(worst, index, tails)
    combined = np.minimum(1.0, worst * len(models))
    found = [
        Anomaly(voter=voter, p_value=float(p_value), votes=own, test="concentration")
        for (voter, _, own), p_value in zip(judged, combined, strict=True)
        if p_value < alpha
    ]
    return sorted(found, key=lambda anomaly: anomaly.p_value)


def suspicious_voters(votes: Iterable[PairVote], *, alpha: float = 1e-4, min_votes: int = 5) -> list[Anomaly]:
    """Voters caught by either test, each with the smaller of its p-values."""
    votes = list(votes)
    found: dict[str, Anomaly] = {}
    for anomaly in anomalous_voters(votes, alpha=alpha, min_votes=min_votes) + concentrated_voters(
        votes, alpha=alpha, min_votes=min_votes
    ):
        if anomaly.voter not in found or anomaly.p_value < found[anomaly.voter].p_value:
            found[anomaly.voter] = anomaly
    return sorted(found.values(), key=lambda anomaly: anomaly.p_value)


def pair_vote(voter: str, model_a: str, model_b: str, choice: str, count: int = 1) -> PairVote:
    """Votes as the detector sees them: the pair in name order, the outcome for its first model."""
    first_won = (choice == "a") == (model_a <= model_b)
    outcome = 0.5 if choice in ("tie", "both_bad") else float(first_won)
    first, second = sorted((model_a, model_b))
    return PairVote(voter=voter, pair=(first, second), outcome=outcome, count=count)
