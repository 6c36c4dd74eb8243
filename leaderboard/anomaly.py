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
n decisive votes, at the share of the other voters' decisive votes that chose it. Other
stuffers raise that share, but not nearly enough to hide a run of choices of one model. Every
model is tested at a strict level (the smallest tail times the number of models, Bonferroni);
the models under attack (``attacked_models``: more voters concentrate on them than chance
allows) are tested again at a lenient one (1% at the refresh), so that a stuffer who hides its
target votes among honest ones is judged against its target alone, and an honest voter risks
the lenient level only where a campaign shows.

A campaign that starts every battle in a fresh session has one vote per voter key: the same
tests run on the votes grouped by network, and behind a flagged network only the voters whose
votes there mostly chose its target are flagged (``campaign_voters``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import betainc, gammaincc
from scipy.stats import binom

OUTCOMES = (0.0, 0.5, 1.0)  # The second model of the pair won; a tie or both bad; the first won.
CHOICE_SCORES = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}  # The outcome for side A's model.
# The chance that an honest voter key is flagged, the refresh's default (LEADERBOARD_ANOMALY_FALSE_ALARMS).
FALSE_ALARMS = 0.01
# The concentration test's screening for models under attack (attacked_models).
SCREEN_LEVEL, SCREEN_CUT = 1e-5, 0.01
# Voters with at least this many decisive votes measure how far tastes spread (taste_spread),
# when there are at least TASTE_MIN_VOTERS of them.
TASTE_MIN_VOTES, TASTE_MIN_VOTERS = 30, 50


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


@dataclass(frozen=True)
class VoteTable:
    """The detector's input as arrays, one row per (voter, pair, outcome) with its count, as a
    GROUP BY returns it: codes into ``voters`` and ``models``, the pair's first model the one
    with the smaller code, the outcome for it (``OUTCOMES``). Both tests run on it in numpy, so
    a million votes take a fraction of a second."""

    voters: list[str]
    models: list[str]
    voter: np.ndarray
    first: np.ndarray
    second: np.ndarray
    outcome: np.ndarray
    count: np.ndarray

    @classmethod
    def from_votes(cls, votes: Iterable[PairVote] | VoteTable) -> VoteTable:
        if isinstance(votes, VoteTable):
            return votes
        voters: dict[str, int] = {}
        models: dict[str, int] = {}
        rows = [
            (
                voters.setdefault(vote.voter, len(voters)),
                models.setdefault(vote.pair[0], len(models)),
                models.setdefault(vote.pair[1], len(models)),
                vote.outcome,
                vote.count,
            )
            for vote in votes
        ]
        voter, a, b, outcome, count = np.array(rows, dtype=float).reshape(-1, 5).T
        # Codes follow first appearance, not names: put the smaller code first, flipping the outcome.
        swap = a > b
        return cls(
            list(voters),
            list(models),
            voter.astype(np.intp),
            np.where(swap, b, a).astype(np.intp),
            np.where(swap, a, b).astype(np.intp),
            np.where(swap, 1.0 - outcome, outcome).astype(float),
            count.astype(float),
        )

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[str, Hashable, Hashable, str, int]]) -> VoteTable:
        """From rows as a GROUP BY over the stored votes returns them: the voter, the models on
        sides A and B (any labels: names or ids), the choice ("a", "b", "tie" or "both_bad") and
        how many such votes. One pass per column (a million rows take well under a second)."""
        voter_codes: dict[str, int] = {}
        model_codes: dict[Hashable, int] = {}
        count = len(rows)
        voter = np.fromiter((voter_codes.setdefault(row[0], len(voter_codes)) for row in rows), np.intp, count)
        a = np.fromiter((model_codes.setdefault(row[1], len(model_codes)) for row in rows), np.intp, count)
        b = np.fromiter((model_codes.setdefault(row[2], len(model_codes)) for row in rows), np.intp, count)
        score_a = np.fromiter((CHOICE_SCORES[row[3]] for row in rows), float, count)
        return cls(
            list(voter_codes),
            [str(model) for model in model_codes],
            voter,
            np.minimum(a, b),
            np.maximum(a, b),
            np.where(a < b, score_a, 1.0 - score_a),
            np.fromiter((row[4] for row in rows), float, count),
        )


def anomalous_voters(
    votes: Iterable[PairVote] | VoteTable, *, alpha: float = 1e-4, min_votes: int = 5, min_history: int = 10
) -> list[Anomaly]:
    """Voters whose votes, together, are too unlikely given how everyone else voted."""
    table = VoteTable.from_votes(votes)
    if table.voter.size == 0:
        return []
    n_voters, n_models = len(table.voters), len(table.models)
    pair = table.first * n_models + table.second  # Dense codes: a few thousand pairs at most.
    code = (table.outcome * 2).astype(np.intp)  # 0, 1, 2: the outcomes in increasing order.
    pair_totals = np.bincount(pair * 3 + code, table.count, minlength=n_models * n_models * 3).reshape(-1, 3)
    # The voter's own votes on the pair: rows of one (voter, pair) are adjacent once sorted (a
    # GROUP BY voter, pair, outcome returns them so; the sort is skipped then).
    key = table.voter.astype(np.int64) * (n_models * n_models) + pair
    order = None if np.all(key[1:] >= key[:-1]) else np.argsort(key, kind="stable")
    sorted_key = key if order is None else key[order]
    new_group = np.ones(key.size, dtype=bool)
    new_group[1:] = sorted_key[1:] != sorted_key[:-1]
    group = np.cumsum(new_group) - 1
    if order is not None:
        group[order] = group.copy()
    own = np.bincount(group * 3 + code, table.count, minlength=(int(group.max()) + 1) * 3).reshape(-1, 3)
    history = pair_totals[pair] - own[group]  # Everyone else's votes on the pair.
    lower, middle = history[:, 0], history[:, 1]
    total = lower + middle + history[:, 2]
    same = history.ravel()[np.arange(code.size) * 3 + code]  # Votes with this row's outcome.
    at_most = np.where(code == 0, lower, np.where(code == 1, lower + middle, total))
    at_least = total - at_most + same
    p_values = np.minimum(1.0, 2.0 * (np.minimum(at_least, at_most) + 1.0) / (total + 1.0))
    judged = total >= min_history
    weights = table.count[judged]
    compared = np.bincount(table.voter[judged], weights, minlength=n_voters)
    minus_log_p = np.bincount(table.voter[judged], weights * -np.log(p_values[judged]), minlength=n_voters)
    candidates = np.flatnonzero(compared >= max(min_votes, 1))
    # Fisher: P(chi-squared with 2k degrees of freedom >= 2h) is the regularised upper
    # incomplete gamma function Q(k, h).
    combined = gammaincc(compared[candidates], minus_log_p[candidates])
    found = [
        Anomaly(voter=table.voters[index], p_value=float(p_value), votes=round(compared[index]))
        for index, p_value in zip(candidates, combined, strict=True)
        if p_value < alpha
    ]
    return sorted(found, key=lambda anomaly: anomaly.p_value)


def concentrated_voters(
    votes: Iterable[PairVote] | VoteTable,
    *,
    alpha: float = 1e-4,
    attacked_alpha: float | None = None,
    min_votes: int = 5,
    screen: float = SCREEN_LEVEL,
    screen_cut: float = SCREEN_CUT,
) -> list[Anomaly]:
    """Voters who chose one model far more often than the other voters do (module docstring):
    tested against every model (Bonferroni over the models) at ``alpha``, and against the
    models under attack only (``attacked_models``; Bonferroni over those) at ``attacked_alpha``
    (None: ``alpha``). The p-value reported is the smaller of the two tests'. Voters' tastes
    spread their choices beyond the binomial (``taste_spread``): each tail is the binomial's of
    the votes divided by their design effect, 1 + (n - 1) * spread. A voter whose choices
    follow everyone else's is flagged with probability at most ``alpha`` where no model is under
    attack, and ``alpha + attacked_alpha`` where one is."""
    table = VoteTable.from_votes(votes)
    present = np.zeros(len(table.models), dtype=bool)
    present[table.first] = present[table.second] = True
    n_models = int(present.sum())
    decisive = table.outcome != 0.5
    chosen = np.where(table.outcome == 1.0, table.first, table.second)[decisive]
    voter, count = table.voter[decisive], table.count[decisive]
    if voter.size == 0:
        return []
    # Decisive votes per (voter, model chosen), densely: voters x models cells.
    dense = np.bincount(voter * len(table.models) + chosen, count, minlength=len(table.voters) * len(table.models))
    cells = np.flatnonzero(dense)
    per_cell = dense[cells]
    own = np.bincount(voter, count, minlength=len(table.voters))
    everyone = np.bincount(chosen, count, minlength=len(table.models))
    total = everyone.sum()
    cell_voter, cell_model = cells // len(table.models), cells % len(table.models)
    judged = (own[cell_voter] >= min_votes) & (total > own[cell_voter])
    cell_voter, cell_model, per_cell = cell_voter[judged], cell_model[judged], per_cell[judged]
    if per_cell.size == 0:
        return []
    # The other voters' share, with one pseudo-vote so that a model nobody else chose does not
    # make any choice of it infinitely unlikely.
    others = total - own[cell_voter]
    share = (everyone[cell_model] - per_cell + 1) / (others + 1)
    # A count at or below its binomial mean has a tail of at least one half (the median is at
    # least the mean's floor): it can neither flag its voter nor count in the screening (both
    # need a tail below one half), so only the counts above their mean are computed.
    above = per_cell > own[cell_voter] * share
    cell_voter, cell_model = cell_voter[above], cell_model[above]
    made, cast, share = per_cell[above], own[cell_voter], share[above]
    # P(X >= c) for X binomial(n, p) is the regularised incomplete beta I_p(c, n - c + 1), which
    # takes the votes divided by the design effect as they are.
    tails = betainc(made, cast - made + 1.0, share)
    spread = taste_spread(dense.reshape(len(table.voters), -1), own, everyone / total)
    if spread > 0:
        # The design effect only widens a tail: one at or above the cut (or alpha) stays out of
        # the screening and cannot flag, so only the smaller ones are computed again (with
        # fractional counts, the incomplete beta is three times slower).
        small = tails < max(screen_cut, alpha, attacked_alpha or 0.0)
        effect = 1.0 + (cast[small] - 1.0) * spread
        tails[small] = betainc(made[small] / effect, (cast[small] - made[small]) / effect + 1.0, share[small])
    judged_votes = own[own >= min_votes]
    effective = np.maximum(1.0, np.round(judged_votes / (1.0 + (judged_votes - 1.0) * spread)))
    attacked = attacked_models(tails, cell_model, everyone / total, effective, level=screen, cut=screen_cut)
    worst = np.ones(len(table.voters))
    np.minimum.at(worst, cell_voter, tails)
    combined = np.minimum(1.0, worst * n_models)
    caught = combined < alpha
    if attacked.size:
        on_attacked = np.isin(cell_model, attacked)
        worst_attacked = np.ones(len(table.voters))
        np.minimum.at(worst_attacked, cell_voter[on_attacked], tails[on_attacked])
        targeted = np.minimum(1.0, worst_attacked * attacked.size)
        caught |= targeted < (alpha if attacked_alpha is None else attacked_alpha)
        combined = np.minimum(combined, targeted)
    flagged = np.flatnonzero(caught)
    found = [
        Anomaly(
            voter=table.voters[index], p_value=float(combined[index]), votes=round(own[index]), test="concentration"
        )
        for index in flagged
    ]
    return sorted(found, key=lambda anomaly: anomaly.p_value)


def taste_spread(choices: np.ndarray, votes: np.ndarray, shares: np.ndarray) -> float:
    """How much more the voters' choices of a model vary than binomially: honest voters have
    tastes. ``choices``: decisive votes per voter (rows) and model chosen (columns); ``votes``:
    each voter's decisive votes; ``shares``: each model's share of them. If a voter's counts are
    Dirichlet-multinomial (each count's variance n s (1 - s) (1 + (n - 1) rho)), Pearson's
    statistic of its counts against the shares has mean (models - 1) (1 + (n - 1) rho): each
    voter with at least ``TASTE_MIN_VOTES`` votes gives an estimate of rho, and the spread is
    their median: a campaign moves it only with as many such voters as the honest ones. Zero
    with fewer than ``TASTE_MIN_VOTERS`` of them (with ten votes, a taste hardly shows)."""
    heavy = votes >= TASTE_MIN_VOTES
    chosen_models = shares > 0
    if np.count_nonzero(heavy) < TASTE_MIN_VOTERS or np.count_nonzero(chosen_models) < 2:
        return 0.0
    n = votes[heavy]
    expected = n[:, None] * shares[chosen_models][None, :]
    pearson = ((choices[heavy][:, chosen_models] - expected) ** 2 / expected).sum(axis=1)
    rho = (pearson / (np.count_nonzero(chosen_models) - 1.0) - 1.0) / (n - 1.0)
    return max(0.0, float(np.median(rho)))


def attacked_models(
    tails: np.ndarray,
    model: np.ndarray,
    shares: np.ndarray,
    votes: np.ndarray,
    *,
    level: float = SCREEN_LEVEL,
    cut: float = SCREEN_CUT,
) -> np.ndarray:
    """The models more voters concentrate on than chance allows. ``tails``: the concentration
    tails of (voter, ``model``) cells; ``shares``: each model's share of the decisive votes;
    ``votes``: each judged voter's number of decisive votes. For each model, the number of
    voters whose tail is below ``cut`` is a sum of independent Bernoulli variables, each with
    the probability the binomial of that voter's votes at the model's share gives a tail below
    ``cut`` (at most ``cut``: far less for a voter with ten votes); by Hoeffding's inequality for
    such sums, its tail is at most the binomial tail at their mean. A model whose count has a
    tail below ``level`` is under attack. A campaign of a few dozen voters raises its target's
    count far above what a thousand honest voters give, though each of them alone is not
    unlikely enough to flag."""
    if votes.size == 0:
        return np.zeros(0, dtype=np.intp)
    sizes, voters = np.unique(votes, return_counts=True)
    n, share = sizes[:, None], shares[None, :]
    # The smallest count with a tail below cut is ppf(1 - cut) + 1; its tail is the chance.
    chance = binom.sf(binom.ppf(1.0 - cut, n, share), n, share)
    expected = voters @ chance
    low = np.bincount(model[tails < cut], minlength=shares.size).astype(float)
    judged = float(votes.size)
    p = np.ones(shares.size)
    beyond = low >= expected + 1.0
    p[beyond] = binom.sf(low[beyond] - 1.0, judged, expected[beyond] / judged)
    return np.flatnonzero(p < level)


def suspicious_voters(
    votes: Iterable[PairVote] | VoteTable,
    *,
    alpha: float = 1e-4,
    min_votes: int = 5,
    false_alarms: float | None = None,
) -> list[Anomaly]:
    """Voters caught by either test, each with the smaller of its p-values. Both tests run at
    ``alpha``; with ``false_alarms``, the concentration test's judgement on the models under
    attack runs at ``false_alarms - 2 * alpha``, so that an honest voter is flagged with
    probability at most ``false_alarms`` (and about ``2 * alpha`` where no model is under
    attack)."""
    table = VoteTable.from_votes(votes)
    attacked_alpha = None if false_alarms is None else max(false_alarms - 2.0 * alpha, alpha)
    found: dict[str, Anomaly] = {}
    for anomaly in anomalous_voters(table, alpha=alpha, min_votes=min_votes) + concentrated_voters(
        table, alpha=alpha, attacked_alpha=attacked_alpha, min_votes=min_votes
    ):
        if anomaly.voter not in found or anomaly.p_value < found[anomaly.voter].p_value:
            found[anomaly.voter] = anomaly
    return sorted(found.values(), key=lambda anomaly: anomaly.p_value)


def campaign_voters(
    rows: Sequence[tuple[str, str, Hashable, Hashable, str, int]], everyone: VoteTable
) -> dict[str, str]:
    """The voters whose votes a network flag removes: ``rows`` are the votes of flagged
    networks as (network, voter, model A, model B, choice, count), ``everyone`` the voters'
    detector table (its model labels are the rows' models as strings). A network's target is
    the model its decisive votes concentrate on (the smallest binomial tail of its choices of a
    model at everyone's share). A voter behind it is flagged when more than half of the voter's
    decisive votes from it chose that target: every session of a campaign that votes once per
    session, and no honest voter with a few votes among many for other models. Returns each
    such voter with the network it was caught behind."""
    if not rows:
        return {}
    decisive = everyone.outcome != 0.5
    chosen = np.where(everyone.outcome == 1.0, everyone.first, everyone.second)[decisive]
    counts = np.bincount(chosen, everyone.count[decisive], minlength=len(everyone.models))
    share_of = dict(zip(everyone.models, (counts + 1.0) / (counts.sum() + 1.0), strict=True))
    floor = 1.0 / (counts.sum() + 1.0)
    choices: dict[str, Counter[str]] = {}  # Per network: its decisive votes per model chosen.
    ballots: dict[tuple[str, str], Counter[str]] = {}  # Per (network, voter): the same.
    for network, voter, model_a, model_b, choice, count in rows:
        if choice not in ("a", "b"):
            choices.setdefault(network, Counter())
            ballots.setdefault((network, voter), Counter())
            continue
        model = str(model_a if choice == "a" else model_b)
        choices.setdefault(network, Counter())[model] += count
        ballots.setdefault((network, voter), Counter())[model] += count
    targets: dict[str, str] = {}
    for network, chosen_models in choices.items():
        if not chosen_models:
            continue
        total = sum(chosen_models.values())
        models = list(chosen_models)
        made = np.array([chosen_models[model] for model in models], dtype=float)
        shares = np.array([share_of.get(model, floor) for model in models])
        tails = binom.sf(made - 1, total, shares)
        targets[network] = models[int(np.lexsort((-made, tails))[0])]
    found: dict[str, str] = {}
    for (network, voter), chosen_models in ballots.items():
        target = targets.get(network)
        made = chosen_models.get(target, 0) if target is not None else 0
        if 2 * made > sum(chosen_models.values()) and voter not in found:
            found[voter] = network
    return found


def pair_vote(voter: str, model_a: str, model_b: str, choice: str, count: int = 1) -> PairVote:
    """Votes as the detector sees them: the pair in name order, the outcome for its first model."""
    first_won = (choice == "a") == (model_a <= model_b)
    outcome = 0.5 if choice in ("tie", "both_bad") else float(first_won)
    first, second = sorted((model_a, model_b))
    return PairVote(voter=voter, pair=(first, second), outcome=outcome, count=count)
