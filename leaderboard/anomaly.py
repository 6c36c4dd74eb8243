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

A stuffer who votes in every battle, honestly except that it always chooses its target when
the target plays, concentrates little: the target is in about 2/M of its battles (M models).
Its evidence is its choices in those battles. The **favour test** (``favour_tails``): for each
voter and model m, of the voter's votes in battles with m, how many chose m (a tie or "both
bad" chooses neither), against the chance the other voters' votes on each of those pairs give
m; the tail of the count is a beta-binomial's, whose spread (tastes: a voter who likes m
chooses it in all its battles) is measured on the voters with many votes. Its screening for
models under attack counts the voters whose tails fall below 1% (and 5%, for a model so strong
that honest records rarely reach 1%) against the rate the other models show. On a model under
attack a voter is judged at the level whose expected number of honest voters below it is the
budget's share, not at the budget itself: each voter's tail is discrete (ten battles at even
odds: nine or more choices of m have a tail of 1.1%, ten of 0.1%, so a level of 1% flags 0.1%
of such voters).

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
from scipy.special import betainc, betaln, gammaincc, gammaln
from scipy.stats import binom

OUTCOMES = (0.0, 0.5, 1.0)  # The second model of the pair won; a tie or both bad; the first won.
CHOICE_SCORES = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}  # The outcome for side A's model.
# The chance that an honest voter key is flagged, the refresh's default (LEADERBOARD_ANOMALY_FALSE_ALARMS).
FALSE_ALARMS = 0.01
# The concentration test's screening for models under attack (attacked_models).
SCREEN_LEVEL, SCREEN_CUT = 1e-5, 0.01
# The favour test's cut: its screening counts the tails below it, and no level exceeds it.
FAVOUR_CUT = 0.05
# Voters with at least this many decisive votes measure how far tastes spread (taste_spread),
# when there are at least TASTE_MIN_VOTERS of them.
TASTE_MIN_VOTES, TASTE_MIN_VOTERS = 30, 50
# The favour test measures tastes on at most this many of those voters (favour_tails).
TASTE_SAMPLE = 2000


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
    test: str = "fisher"  # "fisher" (against each pair's history), "concentration" or "favour".

    def reason(self) -> str:
        """What an admin reads in the flag."""
        if self.test == "concentration":
            return f"votes concentrated on one model: p = {self.p_value:.1e} over {self.votes} votes"
        if self.test == "favour":
            return f"votes for one model whenever it plays: p = {self.p_value:.1e} over {self.votes} votes"
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


@dataclass(frozen=True)
class CellTails:
    """One per-(voter, model) test's tails: the cells' voters, models and tails, the models
    under attack its screening found, how many models were tested and each voter's votes (the
    decisive ones for the concentration test)."""

    voter: np.ndarray
    model: np.ndarray
    tails: np.ndarray
    attacked: np.ndarray
    n_models: int
    votes: np.ndarray
    # For a test whose tails are discrete (favour): every cell's votes and expected choices, per
    # voter x model, the voters judged and the tastes' spread, to find the level its budget
    # allows (discrete_level).
    null: tuple[np.ndarray, np.ndarray, np.ndarray, float] | None = None
    # Decisive votes per voter x model chosen, flattened (the concentration test's counts).
    choices: np.ndarray | None = None


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
    cut = max(screen_cut, alpha, attacked_alpha or 0.0)
    cells = concentration_tails(table, min_votes=min_votes, cut=cut, screen=screen, screen_cut=screen_cut)
    return judged_cells(table, cells, "concentration", alpha, alpha if attacked_alpha is None else attacked_alpha)


def concentration_tails(
    table: VoteTable,
    *,
    min_votes: int = 5,
    cut: float = SCREEN_CUT,
    screen: float = SCREEN_LEVEL,
    screen_cut: float = SCREEN_CUT,
) -> CellTails | None:
    """The concentration test's tails (``concentrated_voters``); tails at or above ``cut`` are
    left at their binomial values, without the design effect (they can neither flag nor count
    in the screening). None without a cell to judge."""
    present = np.zeros(len(table.models), dtype=bool)
    present[table.first] = present[table.second] = True
    n_models = int(present.sum())
    decisive = table.outcome != 0.5
    chosen = np.where(table.outcome == 1.0, table.first, table.second)[decisive]
    voter, count = table.voter[decisive], table.count[decisive]
    if voter.size == 0:
        return None
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
        return None
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
        # The design effect only widens a tail: one at or above the cut stays out of the
        # screening and cannot flag, so only the smaller ones are computed again (with
        # fractional counts, the incomplete beta is three times slower).
        small = tails < cut
        effect = 1.0 + (cast[small] - 1.0) * spread
        tails[small] = betainc(made[small] / effect, (cast[small] - made[small]) / effect + 1.0, share[small])
    judged_votes = own[own >= min_votes]
    effective = np.maximum(1.0, np.round(judged_votes / (1.0 + (judged_votes - 1.0) * spread)))
    attacked = attacked_models(tails, cell_model, everyone / total, effective, level=screen, cut=screen_cut)
    return CellTails(cell_voter, cell_model, tails, attacked, n_models, own, choices=dense)


def favour_tails(
    table: VoteTable,
    *,
    min_votes: int = 5,
    cut: float = FAVOUR_CUT,
    screen: float = SCREEN_LEVEL,
    choices: np.ndarray | None = None,
) -> CellTails | None:
    """The favour test's tails (module docstring): for each voter and model m, of the voter's
    n votes in battles with m, how many chose m (c; a tie or "both bad" chooses neither),
    against the chance the other voters' votes on each of those pairs give m (this row's votes
    left out, one pseudo-vote each way): p_1 ... p_n, mean p. Without tastes the count of a
    voter without a preference is a sum of independent Bernoulli variables, whose tail P(X >= c)
    is at most the binomial(n, p) tail for c >= n p + 1 (Hoeffding 1956); only those counts are
    judged. Tastes make a voter's choices of m go together: the tail is the beta-binomial's of
    mean p and intra-class correlation ``favour_spread`` (``beta_binomial_tail``). Tails at or
    above ``cut`` are left at one. ``CellTails.null`` keeps every cell's n and n p, the voters
    judged and the spread, for ``discrete_level``. The screening (``screen``) is in the module docstring.
    ``choices``: the voters' decisive votes per voter x model chosen, flattened, if counted
    already (``CellTails.choices``)."""
    if table.voter.size == 0:
        return None
    n_voters, n_models = len(table.voters), len(table.models)
    voter, first, second, count = table.voter, table.first, table.second, table.count
    # Whether each row's votes chose its first model, its second one (neither: a tie or both bad).
    chose_first, chose_second = count * (table.outcome == 1.0), count * (table.outcome == 0.0)
    pair = first * n_models + second
    played = np.bincount(pair, count, minlength=n_models * n_models)[pair] - count + 2.0
    # The others' chances that a vote on the pair chooses its first, its second model: this
    # row's votes left out, one pseudo-vote each way.
    p_first = (np.bincount(pair, chose_first, minlength=n_models * n_models)[pair] - chose_first + 1.0) / played
    p_second = (np.bincount(pair, chose_second, minlength=n_models * n_models)[pair] - chose_second + 1.0) / played
    size = n_voters * n_models
    n, mean = cell_sums(voter * n_models, first, second, count, (p_first, p_second), size)
    if choices is None:
        decisive = table.outcome != 0.5
        chosen = np.where(table.outcome == 1.0, first, second)[decisive]
        choices = np.bincount(voter[decisive] * n_models + chosen, count[decisive], minlength=size)
    made = choices
    own = np.bincount(voter, count, minlength=n_voters)
    # Tastes, measured on at most TASTE_SAMPLE of the voters with many votes (evenly spaced).
    heavy = np.flatnonzero(own >= TASTE_MIN_VOTES)
    spread = 0.0
    if heavy.size >= TASTE_MIN_VOTERS:
        heavy = heavy[np.linspace(0, heavy.size - 1, min(heavy.size, TASTE_SAMPLE)).astype(np.intp)]
        # Their cells' binomial variances, from their rows alone.
        position = np.full(n_voters, -1, dtype=np.intp)
        position[heavy] = np.arange(heavy.size)
        rows = np.flatnonzero(position[voter] >= 0)
        at = position[voter[rows]] * n_models
        variance = np.bincount(
            np.concatenate((at + first[rows], at + second[rows])),
            np.concatenate(
                (
                    count[rows] * p_first[rows] * (1.0 - p_first[rows]),
                    count[rows] * p_second[rows] * (1.0 - p_second[rows]),
                )
            ),
            minlength=heavy.size * n_models,
        ).reshape(heavy.size, n_models)
        spread = favour_spread(*(array.reshape(n_voters, n_models)[heavy] for array in (n, made, mean)), variance)
    judged_voters = own >= min_votes
    judged_cells_all = (n > 0) & judged_voters.repeat(n_models)
    judged = judged_cells_all & (made >= mean + 1.0)
    index = np.flatnonzero(judged)
    if index.size == 0:
        return None
    tails = favour_tail(made[index], n[index], mean[index] / n[index], spread, cut)
    cell_voter, cell_model = index // n_models, index % n_models
    # Screening, at two cuts (1%, and 5% for a model so strong that its all-win records rarely
    # reach 1%; Bonferroni over the two): the cells that could have a tail below the cut (all n
    # votes for m would reach it) and those that have, per model. Each model's count
    # is binomial at the rate the other models' cells give (one pseudo-cell each way; at most
    # the cut): a campaign raises its target's count alone.
    all_wins = np.log(np.maximum(mean, 1e-300) / np.maximum(n, 1.0)) * n
    screened = np.ones(n_models)
    binomially = np.flatnonzero(judged_cells_all & (all_wins < math.log(FAVOUR_CUT)))
    if spread > 0:  # Where tastes spread, all n votes for m are likelier: P = B(a + n, b) / B(a, b).
        total = 1.0 / spread - 1.0
        chance = mean[binomially] / n[binomially]
        a = chance * total
        all_wins[binomially] = gammaln(a + n[binomially]) - gammaln(a) - gammaln(total + n[binomially]) + gammaln(total)
    for screen_cut in (SCREEN_CUT, FAVOUR_CUT):
        reach = binomially[all_wins[binomially] < math.log(screen_cut)]
        possible = np.bincount(reach % n_models, minlength=n_models).astype(float)
        low = np.bincount(cell_model[tails < screen_cut], minlength=n_models).astype(float)
        rate = np.minimum(screen_cut, (low.sum() - low + 1.0) / (possible.sum() - possible + 2.0))
        beyond = low >= possible * rate + 1.0
        screened[beyond] = np.minimum(
            screened[beyond], 2.0 * binom.sf(low[beyond] - 1.0, possible[beyond], rate[beyond])
        )
    present = np.zeros(n_models, dtype=bool)
    present[first] = present[second] = True
    return CellTails(
        cell_voter,
        cell_model,
        tails,
        np.flatnonzero(screened < screen),
        int(present.sum()),
        own,
        (n, mean, judged_voters, spread),
    )


def favour_tail(made: np.ndarray, n: np.ndarray, share: np.ndarray, spread: float, cut: float) -> np.ndarray:
    """The favour test's tail of ``made`` choices of a model in ``n`` battles with it at the
    others' mean chance ``share`` (``favour_tails``); one where it is at or above ``cut``."""
    tails = betainc(made, n - made + 1.0, share)
    # Overdispersion only widens an upper tail: the ones already at or above the cut stay out.
    small = tails < cut
    tails[small] = beta_binomial_tail(made[small], n[small], share[small], spread)
    tails[tails >= cut] = 1.0
    return tails


def discrete_level(n: np.ndarray, share: np.ndarray, spread: float, cut: float, allowed: float) -> float:
    """The largest level L (at most ``cut``) at which the cells of one model (``n`` votes in
    battles with it at the others' mean chance ``share`` each), judged by ``favour_tail``,
    expect at most ``allowed`` tails at or below L among voters without a preference. A cell's
    tail is discrete: it is at most L with probability t(c), the tail of the smallest count c
    whose tail is at most L, often far below L (ten battles at even odds, binomially: only ten
    choices of ten reach 1%, with a tail of 0.1%). Each cell's tails are computed for its 32 largest counts;
    a cell with more counts that could reach the level counts L in full (P(T <= L) <= L)."""
    cells = n > 0
    n, share = n[cells], share[cells]
    start = np.maximum(np.ceil(n * share + 1.0), 1.0)  # Smaller counts get no tail below one.
    span = np.maximum(n - start + 1.0, 0.0)
    counted = np.minimum(span, 32.0).astype(np.intp)
    wide = float(np.count_nonzero(span > 32.0))
    owner = np.repeat(np.arange(n.size), counted)
    step = np.arange(owner.size) - np.repeat(np.cumsum(counted) - counted, counted)  # c = n - step
    made = n[owner] - step
    tails = favour_tail(made, n[owner], share[owner], spread, cut)
    # P(T <= L) for a cell is the tail of its smallest count whose tail is at most L: passing
    # the tail of count c adds t(c) - t(c + 1) to it.
    previous = np.concatenate(([0.0], tails[:-1]))
    previous[step == 0] = 0.0
    low = tails < cut
    order = np.argsort(tails[low], kind="stable")
    levels = tails[low][order]
    expected = np.cumsum((tails - previous)[low][order]) + levels * wide
    within = np.flatnonzero(expected <= allowed)
    return float(levels[within[-1]]) if within.size else 0.0


def beta_binomial_tail(
    made: np.ndarray, n: np.ndarray, share: np.ndarray, spread: float, *, terms: int = 32
) -> np.ndarray:
    """P(X >= made) for X beta-binomial: n votes whose chance of the outcome varies from voter
    to voter as a beta distribution of mean ``share`` and intra-class correlation ``spread``
    (variance n p (1 - p) (1 + (n - 1) spread), as the design effect). The first pmf term from
    log-gamma functions, the next ones by the ratio of consecutive terms; a tail that would need
    more than ``terms`` terms is the binomial's of the votes divided by the design effect (a
    wider tail far from the mean). Binomial when ``spread`` is zero."""
    if spread <= 0.0 or made.size == 0:
        return betainc(made, n - made + 1.0, share)
    total = 1.0 / spread - 1.0
    a, b = share * total, (1.0 - share) * total
    first = (
        gammaln(n + 1.0) - gammaln(made + 1.0) - gammaln(n - made + 1.0) + betaln(made + a, n - made + b) - betaln(a, b)
    )
    k = made[:, None] + np.arange(terms - 1)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (n[:, None] - k) / (k + 1.0) * (k + a[:, None]) / (n[:, None] - k - 1.0 + b[:, None])
    ratio = np.where(k < n[:, None], ratio, 0.0)
    terms_sum = 1.0 + np.cumprod(ratio, axis=1).sum(axis=1)
    tails = np.minimum(1.0, np.exp(first) * terms_sum)
    wide = n - made >= terms
    if wide.any():
        effect = 1.0 + (n[wide] - 1.0) * spread
        tails[wide] = betainc(made[wide] / effect, (n[wide] - made[wide]) / effect + 1.0, share[wide])
    return tails


def cell_sums(
    cell_base: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    count: np.ndarray,
    chances: tuple[np.ndarray, np.ndarray],
    size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per (voter, model) cell (``cell_base`` + model code, per row): the votes in battles with
    the model (``count`` per row) and the expected number of them that choose it (each vote's
    chance, ``chances`` for the first and second model of its row)."""
    p_first, p_second = chances
    rows = count.size
    cells = np.empty(2 * rows, dtype=np.intp)
    np.add(cell_base, first, out=cells[:rows])
    np.add(cell_base, second, out=cells[rows:])
    weights = np.empty(2 * rows)
    weights[:rows] = weights[rows:] = count
    n = np.bincount(cells, weights, minlength=size)
    np.multiply(count, p_first, out=weights[:rows])
    np.multiply(count, p_second, out=weights[rows:])
    return n, np.bincount(cells, weights, minlength=size)


def favour_spread(n: np.ndarray, made: np.ndarray, mean: np.ndarray, variance: np.ndarray) -> float:
    """How much more a voter's choices of a model in its battles vary than independently
    (``favour_tails``; voters x models cells): if a cell's count
    has variance v (1 + (n - 1) rho), the sum over a voter's models of (c - mean)^2 - v has mean
    rho times the sum of (n - 1) v. Each voter gives an estimate of rho; the spread is their
    median (a campaign moves it only with as many voters as the honest ones)."""
    # The median voter's sum of squares is its mean times chi-squared's median over its mean
    # (k cells with votes): matched so, the median of the estimates is not biased low.
    cells = np.count_nonzero(variance > 0, axis=1).astype(float)
    squares = ((made - mean) ** 2).sum(axis=1) * cells / chi_squared_median(np.maximum(cells, 1.0))
    excess = squares - variance.sum(axis=1)
    scale = ((n - 1.0).clip(min=0.0) * variance).sum(axis=1)
    rho = excess[scale > 0] / scale[scale > 0]
    return max(0.0, float(np.median(rho))) if rho.size else 0.0


def chi_squared_median(k: np.ndarray | float) -> np.ndarray | float:
    """The median of chi-squared with k degrees of freedom (Wilson and Hilferty: k (1 - 2 / 9k)^3,
    within 0.1% from k = 3 on)."""
    return k * (1.0 - 2.0 / (9.0 * k)) ** 3


def judged_cells(
    table: VoteTable,
    cells: CellTails | None,
    test: str,
    alpha: float,
    attacked_alpha: float,
    attacked: np.ndarray | None = None,
) -> list[Anomaly]:
    """The voters one per-(voter, model) test flags: the smallest tail over the models times
    their number (Bonferroni) below ``alpha``, or the smallest over the models under attack
    (``attacked``; None: the test's own screening) times theirs below ``attacked_alpha``. Each
    with the smaller of the two p-values. A test with discrete tails (``CellTails.null``) also
    flags, on each model under attack, a tail at or below the level at which the judged voters
    expect ``attacked_alpha`` / (models under attack) of their number below it
    (``discrete_level``; at least the plain level)."""
    if cells is None:
        return []
    attacked = cells.attacked if attacked is None else attacked
    worst = np.ones(len(table.voters))
    np.minimum.at(worst, cells.voter, cells.tails)
    combined = np.minimum(1.0, worst * cells.n_models)
    caught = combined < alpha
    if attacked.size:
        on_attacked = np.isin(cells.model, attacked)
        worst_attacked = np.ones(len(table.voters))
        np.minimum.at(worst_attacked, cells.voter[on_attacked], cells.tails[on_attacked])
        targeted = np.minimum(1.0, worst_attacked * attacked.size)
        caught |= targeted < attacked_alpha
        if cells.null is not None:
            # Discrete tails: each attacked model's level is the largest its share of the budget
            # allows in expectation (discrete_level), at least the plain one.
            n, mean, judged_voters, spread = cells.null
            judged = float(np.count_nonzero(judged_voters))
            models = n.size // len(table.voters)
            for model in attacked:
                votes, expected = n[model::models][judged_voters], mean[model::models][judged_voters]
                share = expected / np.maximum(votes, 1.0)
                level = discrete_level(votes, share, spread, FAVOUR_CUT, attacked_alpha / attacked.size * judged)
                on_model = cells.model == model
                caught[cells.voter[on_model & (cells.tails <= level)]] = True
        combined = np.minimum(combined, targeted)
    found = [
        Anomaly(voter=table.voters[index], p_value=float(combined[index]), votes=round(cells.votes[index]), test=test)
        for index in np.flatnonzero(caught)
    ]
    return sorted(found, key=lambda anomaly: anomaly.p_value)


def taste_spread(choices: np.ndarray, votes: np.ndarray, shares: np.ndarray) -> float:
    """How much more the voters' choices of a model vary than binomially: honest voters have
    tastes. ``choices``: decisive votes per voter (rows) and model chosen (columns); ``votes``:
    each voter's decisive votes; ``shares``: each model's share of them. If a voter's counts are
    Dirichlet-multinomial (each count's variance n s (1 - s) (1 + (n - 1) rho)), Pearson's
    statistic of its counts against the shares is about (1 + (n - 1) rho) times chi-squared with
    models - 1 degrees of freedom: each voter with at least ``TASTE_MIN_VOTES`` votes gives an
    estimate of rho (its statistic over that chi-squared's median), and the spread is their
    median: a campaign moves it only with as many such voters as the honest ones. Zero
    with fewer than ``TASTE_MIN_VOTERS`` of them (with ten votes, a taste hardly shows)."""
    heavy = votes >= TASTE_MIN_VOTES
    chosen_models = shares > 0
    if np.count_nonzero(heavy) < TASTE_MIN_VOTERS or np.count_nonzero(chosen_models) < 2:
        return 0.0
    n = votes[heavy]
    expected = n[:, None] * shares[chosen_models][None, :]
    pearson = ((choices[heavy][:, chosen_models] - expected) ** 2 / expected).sum(axis=1)
    rho = (pearson / chi_squared_median(np.count_nonzero(chosen_models) - 1.0) - 1.0) / (n - 1.0)
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
    """Voters caught by any of the three tests (against the pair's history, concentration,
    favour), each with the smallest of its p-values. Each test runs at ``alpha``; the models
    under attack are those either screening finds, and with ``false_alarms`` the concentration
    and favour tests' judgements on them run at half of ``false_alarms - 3 * alpha`` each, so
    that an honest voter is flagged with probability at most ``false_alarms`` (and about
    ``3 * alpha`` where no model is under attack)."""
    table = VoteTable.from_votes(votes)
    attacked_alpha = alpha if false_alarms is None else max((false_alarms - 3.0 * alpha) / 2.0, alpha)
    cut = max(SCREEN_CUT, alpha, attacked_alpha)
    concentration = concentration_tails(table, min_votes=min_votes, cut=cut)
    favour = favour_tails(
        table,
        min_votes=min_votes,
        cut=max(cut, FAVOUR_CUT),
        choices=None if concentration is None else concentration.choices,
    )
    attacked = np.union1d(
        *(cells.attacked if cells is not None else np.zeros(0, dtype=np.intp) for cells in (concentration, favour))
    )
    found: dict[str, Anomaly] = {}
    for anomaly in (
        anomalous_voters(table, alpha=alpha, min_votes=min_votes)
        + judged_cells(table, concentration, "concentration", alpha, attacked_alpha, attacked)
        + judged_cells(table, favour, "favour", alpha, attacked_alpha, attacked)
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
