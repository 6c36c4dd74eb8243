"""How fragile each rank is: for every adjacent pair of a board, the number of votes whose
removal would swap the two models (the drop-a-few-votes check of Huang, Shen, Wei and Broderick,
"Dropping Just a Handful of Preferences Can Change Top Large Language Model Rankings",
arXiv 2508.11847). No Django.

A board's votes are (pair, outcome) cells (``ratings.PairOutcomes``): every vote of a cell is
alike, so a removal is a number of votes taken from each cell. For the pair (upper, lower) of
adjacent rows, the gap is d = theta_upper - theta_lower in log strength. Removing one vote of a
cell moves the fit, to first order, by the influence function: with H the Fisher information of
the fit (the prior's virtual ties included), a vote of pair (i, j) with score y for i (1, 0, ½)
and fitted P(i beats j) = p moves d by

    -w (y - p) (u_i - u_j),   u = H⁺ (e_upper - e_lower),

(w the vote's pair weight, 1 unless pairs are weighted). The search orders the cells whose
votes close the gap, most per vote first, and removes votes in that order: the first k votes of
that order are "the k most influential votes". The first-order sum gives a first guess of k;
each guess is then checked by refitting the Bradley-Terry model without those votes (to
convergence, same prior, same models, the pairs' weights as on the full board: ``_Search.refit``),
and the guesses are refined (by Newton's method on the refitted gaps, then bisection) until k
votes swap the pair and k - 1 do not. "Swap" means the lower model's rating reaches the upper's
(a rating tie is swapped: 0 votes).

The count is exact for this order (checked by refits), and an upper bound of the true minimum
over every subset of votes: like the paper's, the order comes from the first-order
approximation, so another subset might do it with fewer. All pairs of a board are searched
together: each step refits every pending pair's guesses in one batched fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from leaderboard import ratings

# A gap below this (in log strength: 0.0002 rating points, against the page's 0.1) is a tie: the
# pair is level. It is a thousand times the refits' error bound (``REFIT_TOLERANCE``), so that a
# refit of a truly level pair is never read as still apart.
LEVEL = 1e-6
# Refinement steps by Newton's method before the search bisects instead, and at most in all.
NEWTON_STEPS = 6
MAX_STEPS = 60
# A refit's error bound, in log strength (2e-7 rating points), and its steps of the chord method.
REFIT_TOLERANCE = 1e-9
CHORD_ITERATIONS = 50


@dataclass(frozen=True)
class _Cells:
    """Every (pair, outcome) cell with votes: its models, the score of i, count and weight."""

    i: np.ndarray
    j: np.ndarray
    score: np.ndarray  # 1 (i won), 0 (j won), 0.5 (tie)
    count: np.ndarray
    weight: np.ndarray

    @classmethod
    def of(cls, outcomes: ratings.PairOutcomes, weights: np.ndarray | None) -> _Cells:
        scale = np.ones(outcomes.first.size) if weights is None else weights
        counts = np.stack([outcomes.first_wins, outcomes.second_wins, outcomes.ties])  # (3, pairs)
        outcome, pair = np.nonzero(counts > 0)
        return cls(
            outcomes.first[pair],
            outcomes.second[pair],
            np.array([1.0, 0.0, 0.5])[outcome],
            np.rint(counts[outcome, pair]).astype(np.int64),
            scale[pair],
        )


class _Search:
    """The first-order order of removal for each adjacent pair, and refits of its prefixes."""

    def __init__(
        self, outcomes: ratings.PairOutcomes, order: list[int], prior: float | None, weights: np.ndarray | None
    ) -> None:
        n = outcomes.n_models
        self.n, self.prior = n, ratings._prior(prior, n)
        self.cells = _Cells.of(outcomes, weights)
        self.wins = outcomes.wins(weights)
        self.theta = ratings._fit_log_strengths(self.wins, self.prior)
        self.upper, self.lower = np.array(order[:-1], dtype=np.intp), np.array(order[1:], dtype=np.intp)
        self.gap = self.theta[self.upper] - self.theta[self.lower]
        # The Fisher information at the fit, the prior's virtual ties included; the centring term
        # makes it regular (the gaps and the votes' directions are orthogonal to the common shift).
        p = 1.0 / (1.0 + np.exp(self.theta[None, :] - self.theta[:, None]))  # P(row beats column)
        games = outcomes.games() * (1.0 if weights is None else _pair_matrix(outcomes, weights)) + self.prior
        information = games * p * (1.0 - p)
        np.fill_diagonal(information, 0.0)
        information = np.diag(information.sum(axis=1)) - information
        directions = np.zeros((n, self.gap.size))
        directions[self.upper, np.arange(self.gap.size)] = 1.0
        directions[self.lower, np.arange(self.gap.size)] = -1.0
        self.inverse = np.linalg.inv(information + 1.0 / n)
        u = self.inverse @ directions
        cells = self.cells
        # Per vote of each cell, its gradient (w (y - p) on i, the opposite on j) and the change
        # in each pair's gap when it is removed: (cells, pairs).
        self.gradient = cells.weight * (cells.score - p[cells.i, cells.j])
        self.influence = -self.gradient[:, None] * (u[cells.i] - u[cells.j])
        # Every pair i < j (the prior's virtual ties reach the unplayed ones), its score for i and
        # its games with the prior, and where each cell's votes go: what ``refit`` reads.
        self.all_first, self.all_second = np.triu_indices(n, 1)
        self.pair_incidence = np.zeros((self.all_first.size, n))
        self.pair_incidence[np.arange(self.all_first.size), self.all_first] = 1.0
        self.pair_incidence[np.arange(self.all_first.size), self.all_second] = -1.0
        self.score = self.wins[self.all_first, self.all_second] + self.prior / 2.0
        self.games = self.score + self.wins[self.all_second, self.all_first] + self.prior / 2.0
        position = np.zeros((n, n), dtype=np.intp)
        position[self.all_first, self.all_second] = np.arange(self.all_first.size)
        self.cell_pair = position[cells.i, cells.j]
        # Per pair: the cells that close its gap, most per vote first, and where each starts.
        self.sequence: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.guess = np.zeros(self.gap.size, dtype=np.int64)
        self.available = np.zeros(self.gap.size, dtype=np.int64)
        for pair in range(self.gap.size):
            column = self.influence[:, pair]
            closing = np.flatnonzero(column < 0.0)
            closing = closing[np.argsort(column[closing], kind="stable")]
            counts = cells.count[closing]
            ends = np.cumsum(counts)
            self.sequence.append(closing)
            self.starts.append(ends - counts)
            self.available[pair] = int(ends[-1]) if ends.size else 0
            # The first-order guess: votes until the predicted drop reaches the gap.
            drop = np.cumsum(-column[closing] * counts)
            full = int(np.searchsorted(drop, self.gap[pair]))  # Cells taken whole before the last one.
            if full >= closing.size:
                self.guess[pair] = self.available[pair]
            else:
                before = drop[full - 1] if full else 0.0
                needed = math.ceil((self.gap[pair] - before) / -column[closing[full]])
                self.guess[pair] = int(self.starts[pair][full]) + max(needed, 1)

    def removed(self, pair: int, k: int) -> np.ndarray:
        """Votes removed per cell when the first ``k`` of the pair's order are."""
        removed = np.zeros(self.cells.count.size)
        sequence = self.sequence[pair]
        removed[sequence] = np.clip(k - self.starts[pair], 0, self.cells.count[sequence])
        return removed

    def gaps_after(self, probes: list[tuple[int, int]]) -> np.ndarray:
        """Each (pair, k) probe's gap, refitted without the first k votes of the pair's order."""
        removed = np.stack([self.removed(pair, k) for pair, k in probes])
        theta = self.refit(removed)
        pairs = np.array([pair for pair, _ in probes])
        return theta[np.arange(len(probes)), self.upper[pairs]] - theta[np.arange(len(probes)), self.lower[pairs]]

    def refit(self, removed: np.ndarray) -> np.ndarray:
        """The centred log strengths fitted to convergence without the votes ``removed`` (per
        row, votes per cell), the prior as in the full fit.

        Newton's chord method, as the bootstrap's rounds (``ratings._RoundFit``): the full-data
        fit's Hessian is kept for every probe and step, so a step is a few matrix products; its
        fixed point is the probe's own maximum likelihood (the gradient is exact). A removal
        changes the Hessian little, so the error shrinks fast; a probe not converged after
        ``CHORD_ITERATIONS`` ends with full Newton steps."""
        batch, n = removed.shape[0], self.n
        amount = removed * self.cells.weight
        offset = (np.arange(batch) * self.all_first.size)[:, None]
        at = (offset + self.cell_pair).ravel()
        size = batch * self.all_first.size
        score = self.score - np.bincount(at, (amount * self.cells.score).ravel(), minlength=size).reshape(batch, -1)
        games = self.games - np.bincount(at, amount.ravel(), minlength=size).reshape(batch, -1)
        theta = np.broadcast_to(self.theta, (batch, n)).copy()
        previous = np.full(batch, np.nan)
        active = np.arange(batch)  # The probes not converged yet: only those are stepped on.
        for _ in range(CHORD_ITERATIONS):
            current = theta[active]
            p = 1.0 / (1.0 + np.exp(current @ -self.pair_incidence.T))
            step = ((score[active] - games[active] * p) @ self.pair_incidence) @ self.inverse
            current += step
            current -= current.mean(axis=1, keepdims=True)
            theta[active] = current
            # A probe is done once the error left, bounded from the contraction of its last two
            # steps (s q / (1 - q) after a step s at rate q), is below ``REFIT_TOLERANCE``.
            moved = np.max(np.abs(step), axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = moved / previous[active]
                done = (moved < REFIT_TOLERANCE) | ((rate < 0.5) & (moved * rate / (1.0 - rate) < REFIT_TOLERANCE))
            previous[active] = moved
            active = active[~done]
            if not active.size:
                return theta
        score, games = score[active], games[active]
        batch = active.size
        wins = np.zeros((batch, n, n))
        wins[:, self.all_first, self.all_second] = score - self.prior / 2.0
        wins[:, self.all_second, self.all_first] = games - score - self.prior / 2.0
        theta[active] = ratings._fit_log_strengths(
            np.maximum(wins, 0.0), self.prior, start=theta[active], tol=REFIT_TOLERANCE
        )
        return theta


def _pair_matrix(outcomes: ratings.PairOutcomes, weights: np.ndarray) -> np.ndarray:
    matrix = np.ones((outcomes.n_models, outcomes.n_models))
    matrix[outcomes.first, outcomes.second] = weights
    matrix[outcomes.second, outcomes.first] = weights
    return matrix


def swap_votes(
    outcomes: ratings.PairOutcomes,
    order: list[int],
    *,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
) -> list[int | None]:
    """For each model of ``order`` (model indices, best first: the board's rows), the number of
    votes whose removal swaps it with the next one down (see the module's docstring): 0 when the
    two are level, None for the last model, and None when removing every vote that closes the
    gap does not swap them."""
    if len(order) < 2:
        return [None] * len(order)
    weights = ratings._checked_weights(outcomes, pair_weights)
    search = _Search(outcomes, list(order), prior, weights)
    pairs = search.gap.size
    found: list[int | None] = [None] * pairs
    low = np.zeros(pairs, dtype=np.int64)  # Removing this many does not swap the pair...
    high = np.full(pairs, -1, dtype=np.int64)  # ... and this many does (-1: none known yet).
    pending = []
    for pair in range(pairs):
        if search.gap[pair] <= LEVEL:
            found[pair] = 0
        elif search.available[pair] > 0:
            pending.append(pair)
    # The latest refitted probe of each pair nearest the crossing, and the gap's drop per vote there.
    near = np.zeros(pairs, dtype=np.int64)
    near_gap = search.gap.copy()
    slope = np.zeros(pairs)
    for step in range(MAX_STEPS):
        if not pending:
            break
        probes: list[tuple[int, int]] = []
        for pair in pending:
            probes += [(pair, k) for k in _next_probes(search, pair, step, low, high, near, near_gap, slope)]
        gaps = search.gaps_after(probes)
        refitted: dict[int, dict[int, float]] = {}
        for (pair, k), gap in zip(probes, gaps, strict=True):
            refitted.setdefault(pair, {})[k] = float(gap)
            if gap <= LEVEL:
                if high[pair] < 0 or k < high[pair]:
                    high[pair] = k
            elif k > low[pair] and (high[pair] < 0 or k < high[pair]):
                low[pair] = k
        for pair, tried in refitted.items():
            k = max(tried)
            near[pair], near_gap[pair] = k, tried[k]
            if k - 1 in tried:
                slope[pair] = tried[k - 1] - tried[k]
        still = []
        for pair in pending:
            if high[pair] >= 0 and high[pair] == low[pair] + 1:
                found[pair] = int(high[pair])
            elif high[pair] < 0 and low[pair] >= search.available[pair]:
                found[pair] = None  # Every closing vote removed, and still not swapped.
            else:
                still.append(pair)
        pending = still
    return [*found, None]


def _next_probes(
    search: _Search,
    pair: int,
    step: int,
    low: np.ndarray,
    high: np.ndarray,
    near: np.ndarray,
    near_gap: np.ndarray,
    slope: np.ndarray,
) -> list[int]:
    """The numbers of votes to try next for a pair: the predicted crossing and one fewer (both
    refitted: the answer when they straddle it; otherwise their difference is the gap's drop per
    vote there, for the next prediction by Newton's method), inside the bracket (low, high)."""
    lo, bracketed = int(low[pair]), high[pair] >= 0
    if step == 0:
        guess = int(search.guess[pair])
    elif step < NEWTON_STEPS and slope[pair] > 0:
        guess = math.ceil(near[pair] + near_gap[pair] / slope[pair])
        if not bracketed:
            guess = max(guess, lo + 1)
    elif bracketed:
        guess = (lo + int(high[pair]) + 1) // 2
    else:
        guess = 2 * max(lo, 1)
    if bracketed:  # Inside (lo, high): high is known to swap.
        guess = min(max(guess, lo + 1), int(high[pair]))
        return [k for k in (guess - 1, guess) if lo < k < high[pair]]
    guess = min(max(guess, lo + 1), int(search.available[pair]))
    return [k for k in (guess - 1, guess) if k > lo]


def removed_votes(
    outcomes: ratings.PairOutcomes,
    order: list[int],
    position: int,
    k: int,
    *,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
) -> ratings.PairOutcomes:
    """The votes left when the search removes its first ``k`` votes for the pair of rows
    ``position`` and ``position + 1`` of ``order``: what ``swap_votes`` refits, to check it."""
    weights = ratings._checked_weights(outcomes, pair_weights)
    search = _Search(outcomes, list(order), prior, weights)
    removed = search.removed(position, k)
    cells = search.cells
    counts = {
        (int(i), int(j)): [float(won), float(lost), float(tied)]
        for i, j, won, lost, tied in zip(
            outcomes.first, outcomes.second, outcomes.first_wins, outcomes.second_wins, outcomes.ties, strict=True
        )
    }
    for cell in np.flatnonzero(removed):
        slot = {1.0: 0, 0.0: 1, 0.5: 2}[float(cells.score[cell])]
        counts[(int(cells.i[cell]), int(cells.j[cell]))][slot] -= removed[cell]
    return ratings.PairOutcomes.from_cells(outcomes.n_models, counts)
