"""Style control: Bradley-Terry with the two replies' style differences as covariates. No Django.

Voters prefer longer and more formatted replies whatever they say (LMArena's style control,
Chiang et al. 2024). The contextual Bradley-Terry model separates the two:

    logit P(a beats b) = strength[a] - strength[b] + sum_f coefficient[f] * difference_f(a, b)

where each style difference is normalised as LMArena's: (a - b) / (a + b), between -1 and 1 (0
when both are 0), for the replies' length in tokens and their markdown headers, list items and
bold spans. The strengths are then ratings "at equal style", and the coefficients say how much
style moved the votes.

Cost stays flat in the number of votes: differences are rounded to ``BINS`` levels, and votes
reduce to counts per (pair, rounded differences) cell, with wins, losses and ties, as plain
Bradley-Terry reduces them to counts per pair. The fit is Newton's method on those cells, with
the same prior as the plain board (``ratings.default_prior`` virtual ties per pair, at equal
style); intervals are sandwich (Huber-White) intervals from the cells in closed form (what the
site shows), or percentile intervals from a Poisson bootstrap whose rounds are refitted together
(``bootstrap_intervals``: ``rate_battles --style-control --ci bootstrap``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from leaderboard import ratings

FEATURES = ("length", "headers", "lists", "bold")
BINS = 0.05  # Differences are rounded to this step (41 levels from -1 to 1).
_HEADER = re.compile(r"^\s{0,3}#{1,6}\s", re.MULTILINE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s", re.MULTILINE)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")


def markdown_counts(text: str) -> tuple[int, int, int]:
    """Headers, list items and bold spans in a reply, as LMArena counts them."""
    return len(_HEADER.findall(text)), len(_LIST_ITEM.findall(text)), len(_BOLD.findall(text))


def style_of(text: str, tokens: int | None = None) -> tuple[float, ...]:
    """A reply's style: its length in tokens (or characters / 4 when unknown) and markdown counts."""
    length = float(tokens) if tokens is not None else len(text) / 4.0
    return (length, *map(float, markdown_counts(text)))


def rounded_steps(difference: np.ndarray) -> np.ndarray:
    """Differences in ``BINS`` steps, rounded to the nearest, halves away from zero: what the
    database computes too (leaderboard.selectors.style_outcomes), so both bin alike."""
    steps = np.abs(difference) / BINS
    return np.sign(difference) * np.floor(steps + 0.5)


def differences(style_a: Sequence[float], style_b: Sequence[float]) -> np.ndarray:
    """(a - b) / (a + b) per feature, 0 where both are 0."""
    a, b = np.asarray(style_a, dtype=float), np.asarray(style_b, dtype=float)
    total = a + b
    return np.where(total > 0, (a - b) / np.where(total > 0, total, 1.0), 0.0)


@dataclass(frozen=True)
class StyleOutcomes:
    """Votes reduced to counts per cell: a pair (i < j) and the rounded style differences of i
    against j."""

    n_models: int
    first: np.ndarray
    second: np.ndarray
    features: np.ndarray  # [cells, features]
    first_wins: np.ndarray
    second_wins: np.ndarray
    ties: np.ndarray

    @classmethod
    def from_votes(cls, n_models: int, votes: Iterable[tuple[int, int, float, Sequence[float]]]) -> StyleOutcomes:
        """From (model a, model b, score of a, style differences of a against b)."""
        votes = list(votes)
        if not votes:
            return cls.from_arrays(n_models, *(np.zeros(0),) * 3, np.zeros((0, len(FEATURES))))
        a, b, score, difference = zip(*votes, strict=True)
        return cls.from_arrays(n_models, np.array(a), np.array(b), np.array(score, dtype=float), np.array(difference))

    @classmethod
    def from_arrays(
        cls,
        n_models: int,
        a: np.ndarray,
        b: np.ndarray,
        score: np.ndarray,
        difference: np.ndarray,
        counts: np.ndarray | None = None,
    ) -> StyleOutcomes:
        """The same from arrays (a, b, score of a: [votes]; differences: [votes, features];
        ``counts``: how many votes each row stands for, as a GROUP BY returns them), in one
        vectorised pass: each row's key packs the pair, the rounded differences and the outcome
        into one number; one sort groups them. Cells come out in pair order."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if np.any(a == b):
            raise ValueError("A model cannot play itself.")
        difference = np.asarray(difference, dtype=float)
        difference = difference.reshape(a.size, -1) if a.size else np.zeros((0, len(FEATURES)))
        flip = a > b
        score_first = np.where(flip, 1.0 - np.asarray(score, dtype=float), score)
        levels = round(1.0 / BINS)
        base = 2 * levels + 1
        # Integral floats throughout (exact below 2**53): no conversion of a million rows to int.
        key = np.where(flip, b * n_models + a, a * n_models + b).astype(float)
        sign = np.where(flip, -1.0, 1.0)
        for column in difference.T:  # Base ``base`` digits after the pair.
            steps = rounded_steps(column * sign)
            np.clip(steps, -levels, levels, out=steps)
            key *= base
            key += steps + levels
        key *= 3
        key += np.where(score_first == 1.0, 0.0, np.where(score_first == 0.0, 1.0, 2.0))
        if counts is None:
            keys, counts = np.unique(key, return_counts=True)  # Sorted: a cell's outcomes are adjacent.
        else:
            keys, row_key = np.unique(key, return_inverse=True)
            counts = np.bincount(row_key, np.asarray(counts, dtype=float), minlength=keys.size)
        cell_key, outcome = np.divmod(keys.astype(np.int64), 3)  # Integer division: floats' is slow.
        new_cell = np.ones(cell_key.size, dtype=bool)
        new_cell[1:] = cell_key[1:] != cell_key[:-1]
        cell = np.cumsum(new_cell) - 1
        cell_key = cell_key[new_cell]
        per_outcome = np.zeros((cell_key.size, 3))
        per_outcome[cell, outcome] = counts
        digits = np.zeros((cell_key.size, difference.shape[1]), dtype=np.int64)
        rest = cell_key
        for column in range(difference.shape[1] - 1, -1, -1):
            rest, digits[:, column] = np.divmod(rest, base)
        pair = rest.astype(np.intp)
        digits -= levels
        return cls(
            n_models,
            pair // n_models,
            pair % n_models,
            digits * BINS,
            per_outcome[:, 0],
            per_outcome[:, 1],
            per_outcome[:, 2],
        )

    @property
    def total(self) -> float:
        return float(self.first_wins.sum() + self.second_wins.sum() + self.ties.sum())

    def played(self) -> np.ndarray:
        """Per model, whether it has a vote."""
        games = self.first_wins + self.second_wins + self.ties
        count = np.bincount(self.first, weights=games, minlength=self.n_models)
        return (count + np.bincount(self.second, weights=games, minlength=self.n_models)) > 0

    def restricted(self, keep: np.ndarray) -> StyleOutcomes:
        """The cells among the models where ``keep`` is true, renumbered in their order."""
        keep = np.asarray(keep, dtype=bool)
        new_index = np.cumsum(keep) - 1
        inside = keep[self.first] & keep[self.second]
        return StyleOutcomes(
            int(keep.sum()),
            new_index[self.first[inside]],
            new_index[self.second[inside]],
            self.features[inside],
            self.first_wins[inside],
            self.second_wins[inside],
            self.ties[inside],
        )


@dataclass(frozen=True)
class StyleVoters:
    """The votes per (voter, pair, outcome, style differences): what intervals clustered by
    voter need besides the cells. Per row: models ``a`` and ``b``, the score of a, the
    differences a minus b ([rows, features]) and how many votes it stands for."""

    n_models: int
    voter: np.ndarray
    a: np.ndarray
    b: np.ndarray
    score: np.ndarray
    features: np.ndarray
    count: np.ndarray

    def restricted(self, keep: np.ndarray) -> StyleVoters:
        """The rows among the models where ``keep`` is true, renumbered in their order."""
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return self
        inside, a, b = ratings.rows_within(keep, self.a, self.b)
        return StyleVoters(
            int(keep.sum()),
            self.voter[inside],
            a,
            b,
            self.score[inside],
            self.features[inside],
            self.count[inside],
        )


@dataclass(frozen=True)
class StyleControlled:
    ratings: np.ndarray  # Elo scale, mean 1000: the ratings at equal style.
    lower: np.ndarray
    upper: np.ndarray
    ranks: np.ndarray
    coefficients: np.ndarray  # Log-odds per unit of each normalised difference.
    coefficient_lower: np.ndarray
    coefficient_upper: np.ndarray


class _CellsByPair:
    """The cells grouped by pair, for the fit's sums: every per-cell quantity is summed within
    its pair once (``np.add.reduceat`` over cells in pair order), and the pair sums (a few
    hundred) then go to the models. The prior's virtual ties, one set per pair at equal style,
    join at the pair level: they have no features."""

    def __init__(self, outcomes: StyleOutcomes, prior: float) -> None:
        n = self.n = outcomes.n_models
        self.prior = prior
        code = outcomes.first * n + outcomes.second
        order = None if np.all(code[1:] >= code[:-1]) else np.argsort(code, kind="stable")
        pick = (lambda values: values) if order is None else (lambda values: values[order])
        code, self.features = pick(code), pick(outcomes.features)
        self.wins_i, self.wins_j, self.ties = pick(outcomes.first_wins), pick(outcomes.second_wins), pick(outcomes.ties)
        self.ones_and_features = np.column_stack([np.ones(code.size), self.features])
        self.games = self.wins_i + self.wins_j + self.ties
        self.scored = self.wins_i + self.ties / 2.0
        starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if code.size else np.zeros(0, dtype=np.intp)
        self.starts = starts
        first_of_pair = np.zeros(code.size, dtype=bool)
        first_of_pair[starts] = True
        self.group = np.cumsum(first_of_pair) - 1  # Each cell's pair group.
        # Pairs: those with cells, then every pair for the prior (a pair may appear in both).
        first, second = np.triu_indices(n, 1)
        self.first = np.concatenate([code[starts] // n, first])
        self.second = np.concatenate([code[starts] % n, second])
        self.prior_games = np.concatenate([np.zeros(starts.size), np.full(first.size, prior)])

    def pair_sums(self, values: np.ndarray) -> np.ndarray:
        """Sums within each pair group (rows of ``values``), then zeros for the prior's pairs."""
        sums = np.add.reduceat(values, self.starts, axis=0) if self.starts.size else values[:0]
        return np.concatenate([sums, np.zeros((self.first.size - self.starts.size, *values.shape[1:]))])

    def to_models(self, per_pair: np.ndarray) -> np.ndarray:
        """sum over pairs of value * (e_i - e_j): [n] or [n, k] from [pairs] or [pairs, k]."""
        if per_pair.ndim == 1:
            return np.bincount(self.first, per_pair, self.n) - np.bincount(self.second, per_pair, self.n)
        return np.column_stack([self.to_models(column) for column in per_pair.T]).reshape(self.n, -1)

    def blocks(self, weight: np.ndarray, pair_weight: np.ndarray) -> np.ndarray:
        """sum_c weight_c g_c g_c^T over the cells' rows g_c = [e_i - e_j, features_c], plus
        ``pair_weight`` per pair on the strengths alone, block by block: O(cells x features^2),
        never a dense design matrix."""
        n, k = self.n, self.features.shape[1]
        weighted = self.ones_and_features * weight[:, None]  # [weight, weight * features] per cell.
        sums = self.pair_sums(weighted)
        matrix = np.zeros((n + k, n + k))
        matrix[:n, :n] = ratings._laplacian(n, self.first, self.second, sums[:, 0] + pair_weight)
        cross = self.to_models(sums[:, 1:])
        matrix[:n, n:], matrix[n:, :n] = cross, cross.T
        matrix[n:, n:] = (weighted.T @ self.ones_and_features)[1:, 1:]  # One BLAS call on whole rows.
        return matrix

    def probabilities(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """P(i beats j) per cell, and per pair at equal style (the prior's virtual ties)."""
        strengths = params[self.first] - params[self.second]
        logit = strengths[: self.starts.size][self.group] + self.features @ params[self.n :]
        return 1.0 / (1.0 + np.exp(-logit)), 1.0 / (1.0 + np.exp(-strengths))

    def gradient(self, residual: np.ndarray, pair_residual: np.ndarray) -> np.ndarray:
        """sum_c residual_c g_c, plus ``pair_residual`` per pair on the strengths."""
        strengths = self.to_models(self.pair_sums(residual) + pair_residual)
        return np.concatenate([strengths, self.features.T @ residual])


@dataclass(frozen=True)
class _Fit:
    """A contextual Bradley-Terry maximum likelihood: the cells, the parameters (centred log
    strengths, then the coefficients), the last iteration's Hessian and the gauge that makes
    it regular."""

    cells: _CellsByPair
    params: np.ndarray
    hessian: np.ndarray
    gauge: np.ndarray


def _fit(outcomes: StyleOutcomes, prior: float) -> _Fit:
    """Newton's method on the cells, from the plain Bradley-Terry fit of the same votes."""
    n, k = outcomes.n_models, outcomes.features.shape[1]
    cells = _CellsByPair(outcomes, prior)
    params = np.zeros(n + k)
    # Start from the plain Bradley-Terry fit of the same votes (pair sums: nearly free), which
    # saves Newton iterations over every cell.
    scored, games = cells.pair_sums(np.column_stack([cells.scored, cells.games])).T
    wins = np.zeros((n, n))
    np.add.at(wins, (cells.first, cells.second), scored)
    np.add.at(wins, (cells.second, cells.first), games - scored)
    params[:n] = ratings._fit_log_strengths(wins, prior)
    # The strengths' common shift is free: fixing their mean makes the system regular. A feature
    # no reply has (no markdown at all) has no information: a negligible ridge keeps it at 0.
    gauge = np.zeros((n + k, n + k))
    gauge[:n, :n] = 1.0 / n
    gauge[n:, n:] = 1e-9 * np.eye(k)
    hessian = gauge
    for _ in range(100):
        p, p_pair = cells.probabilities(params)
        gradient = cells.gradient(cells.scored - cells.games * p, cells.prior_games * (0.5 - p_pair))
        hessian = cells.blocks(cells.games * p * (1.0 - p), cells.prior_games * p_pair * (1.0 - p_pair))
        step = np.clip(np.linalg.solve(hessian + gauge, gradient), -5.0, 5.0)
        params += step
        params[:n] -= params[:n].mean()
        # Newton converges quadratically: after a step below 1e-5 the error left is of the order
        # of its square, far below anything shown.
        if np.max(np.abs(step)) < 1e-5:
            break
    return _Fit(cells, params, hessian, gauge)


def _controlled(n: int, params: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> StyleControlled:
    """Ratings (Elo scale) and coefficients with their intervals, from parameters and their
    bounds in log strength and log-odds."""
    to_rating = ratings.ELO_SCALE / np.log(10.0)
    fitted, low, high = (ratings.BASE_RATING + to_rating * values[:n] for values in (params, lower, upper))
    return StyleControlled(
        ratings=fitted,
        lower=low,
        upper=high,
        ranks=ratings.ranks_from_intervals(low, high),
        coefficients=params[n:],
        coefficient_lower=lower[n:],
        coefficient_upper=upper[n:],
    )


def style_controlled(
    outcomes: StyleOutcomes, *, prior: float | None = None, level: float = 0.95, voters: StyleVoters | None = None
) -> StyleControlled:
    """The contextual Bradley-Terry fit with sandwich intervals (see the module docstring);
    with ``voters`` (the same votes per voter), clustered by voter as the vote boards' are
    (``ratings.clustered_intervals``): the meat sums each voter's score's outer product, and no
    variance is below the one that takes the votes as independent."""
    n = outcomes.n_models
    fit = _fit(outcomes, ratings.default_prior(n) if prior is None else prior)
    cells = fit.cells
    # Sandwich: the meat sums each vote's squared score, from the cell's outcome counts; the
    # prior's virtual ties are not data. The bread is the last iteration's Hessian: the step
    # after it moved no parameter by 1e-5, which changes it by as little, relatively.
    p, _ = cells.probabilities(fit.params)
    squared = cells.wins_i * (1.0 - p) ** 2 + cells.wins_j * p**2 + cells.ties * (0.5 - p) ** 2
    meat = cells.blocks(squared, np.zeros(cells.first.size))
    inverse = np.linalg.pinv(fit.hessian)
    variance = np.diag(inverse @ meat @ inverse)
    if voters is not None and voters.voter.size:
        logit = fit.params[voters.a] - fit.params[voters.b] + voters.features @ fit.params[n:]
        residual = voters.count * (voters.score - 1.0 / (1.0 + np.exp(-logit)))
        columns = np.column_stack([voters.a, voters.b])
        values = np.column_stack([residual, -residual])
        clustered = ratings.cluster_meat(voters.voter, columns, values, n, voters.features * residual[:, None])
        variance = np.maximum(variance, np.diag(inverse @ clustered @ inverse))
    spread = ratings._z(level) * np.sqrt(np.maximum(variance, 0.0))
    return _controlled(n, fit.params, fit.params - spread, fit.params + spread)


def bootstrap_intervals(
    outcomes: StyleOutcomes,
    *,
    rounds: int = 1000,
    seed: int = 0,
    prior: float | None = None,
    level: float = 0.95,
    threads: int | None = None,
) -> StyleControlled:
    """The contextual Bradley-Terry fit with percentile intervals from ``rounds`` Poisson-bootstrap
    resamplings of the votes, each refitted to its own maximum likelihood (``_StyleRounds``):
    what FastChat's ``compute_bootstrap_style_control`` computes, at a fraction of the cost per
    round. ``threads``: how many rounds' chunks run at once (default: one per CPU)."""
    n = outcomes.n_models
    fit = _fit(outcomes, ratings.default_prior(n) if prior is None else prior)
    if round(outcomes.total) == 0 or rounds < 1:
        return _controlled(n, fit.params, fit.params, fit.params)
    sampler = _StyleRounds(fit)
    chunk = sampler.chunk
    sizes = [min(chunk, rounds - first) for first in range(0, rounds, chunk)]
    seeds = np.random.SeedSequence(seed).spawn(len(sizes))
    workers = max(1, min(len(sizes), threads or os.cpu_count() or 1))
    # The chunks' threads share the cores; BLAS threads inside each would contend with them for
    # products this small (measured: two worker threads over two-threaded BLAS ran slower than
    # one), so BLAS keeps to one thread while the rounds run.
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=workers) as pool:
        fitted = np.concatenate(list(pool.map(sampler.rounds, seeds, sizes)))
    tail = (1.0 - level) / 2.0 * 100.0
    lower, upper = np.percentile(fitted, [tail, 100.0 - tail], axis=0)
    return _controlled(n, fit.params, lower, upper)


# Poisson(1) by inversion of 16 random bits: the draw is the number of these thresholds a
# uniform 16-bit integer reaches, P(X < k) rounded to 1/65536 for k = 1..8 (each probability off
# by at most 2**-17; P(X >= 9) = 1.1e-6 is dropped). Four draws per 64-bit word from the
# generator, and eight comparisons: several times cheaper than numpy's Poisson sampler.
_POISSON_ONE_THRESHOLDS = tuple(
    min(65535, round(65536 * math.exp(-1.0) * sum(1.0 / math.factorial(j) for j in range(k)))) for k in range(1, 9)
)


def poisson_one(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Poisson(1) draws (float32) to a resolution of 2**-16 in probability."""
    size = shape[0] * shape[1]
    bits = rng.bit_generator.random_raw(-(-size // 4)).view(np.uint16)[:size].reshape(shape)
    counts = np.zeros(shape, dtype=np.uint8)
    reached = np.empty(shape, dtype=bool)
    for threshold in _POISSON_ONE_THRESHOLDS:
        np.greater_equal(bits, threshold, out=reached)
        counts += reached.view(np.uint8)
    return counts.astype(np.float32)


class _StyleRounds:
    """Bootstrap rounds of the contextual Bradley-Terry model, refitted together.

    The votes are the cells' nonzero (cell, outcome) entries, each of c votes; the Poisson
    bootstrap weighs each with a Poisson(c) draw (``poisson_one`` where c = 1: most entries,
    when lengths and markdown vary), so a round is one weight per entry, and the prior's virtual
    ties stay as they are, as in the plain board's rounds (``ratings._RoundFit``).

    Layout: the entries of a pair lie in rows of ``width`` entries (a pair's last row padded
    with weight 0), so that [rounds, rows, width] arrays take a pair's strength difference by
    broadcasting and give its sums by one reduction along the rows, and each pass of an
    iteration writes into buffers allocated once per chunk of rounds.

    Refitting: Newton's chord method, as the plain board's rounds, with the full-data fit's
    Hessian: params += H^-1 gradient_round(params) until the error left, bounded from the
    contraction of the last two steps, is below ``TOLERANCE``. The gradient is exact, so each
    round lands on its own maximum likelihood (tests/test_style_control.py checks rounds against
    full fits). The first step starts from
    the full-data fit, where every entry's residual y - p is known: its gradient is one
    weighted sum. Each further iteration is a few passes in single precision: the logit (one
    small matrix product for the features, plus the pair's strength difference), the weighted
    residual w (y - sigmoid(logit)) = w/2 (2y - 1 - tanh(logit / 2)), its sums per row, and
    one matrix product for the features' gradient. Rounds not converged after
    ``CHORD_ITERATIONS`` are refitted by full Newton.
    """

    CHORD_ITERATIONS = 30
    TOLERANCE = 5e-5  # In log strength: 0.009 rating points, against the 0.1 shown.
    BUFFER_ENTRIES = 2**20  # Rounds x padded entries per buffer of a chunk: 4 MB in single precision.

    def __init__(self, fit: _Fit) -> None:
        cells = fit.cells
        self.fit, self.n = fit, cells.n
        counts = np.stack([cells.wins_i, cells.wins_j, cells.ties])
        outcome, cell = np.nonzero(counts.T)[::-1]  # Entries in cell order, hence in pair order.
        self.cell, self.outcome = cell, outcome
        pair = cells.group[cell]
        pairs_with_cells = cells.starts.size
        per_pair = np.bincount(pair, minlength=pairs_with_cells)
        # Rows of ``width`` entries: padding stays below a quarter of the entries (or one row).
        self.width = width = max(1, cell.size // max(1, 4 * pairs_with_cells))
        rows_per_pair = -(-per_pair // width)
        self.row_pair = np.repeat(np.arange(pairs_with_cells), rows_per_pair)
        first_row = np.cumsum(rows_per_pair) - rows_per_pair
        rank_in_pair = np.arange(cell.size) - (np.cumsum(per_pair) - per_pair)[pair]
        self.slot = (first_row[pair] + rank_in_pair // width) * width + rank_in_pair % width
        self.rows = int(rows_per_pair.sum())
        padded = self.rows * width

        def spread(values: np.ndarray, dtype: type = np.float32) -> np.ndarray:
            out = np.zeros((padded, *values.shape[1:]), dtype=dtype)
            out[self.slot] = values
            return out

        self.counts = counts[outcome, cell]
        self.ones_row = np.ones(width, dtype=np.float32)
        self.others = self.slot[self.counts != 1.0]
        self.other_counts = self.counts[self.counts != 1.0]
        self.twice_centred_score = spread(np.array([1.0, -1.0, 0.0])[outcome])  # 2y - 1
        self.half_mask = spread(np.full(cell.size, 0.5))
        p, _ = cells.probabilities(fit.params)
        self.residual = spread(np.array([1.0, 0.0, 0.5])[outcome] - p[cell])  # y - p at the fit.
        self.features = spread(cells.features[cell])
        self.half_features_t = np.ascontiguousarray(0.5 * self.features.T)
        # Row sums go to pairs, then to models, with the prior's pairs: as (e_i - e_j) rows.
        incidence = np.zeros((cells.first.size, self.n))
        incidence[np.arange(cells.first.size), cells.first] = 1.0
        incidence[np.arange(cells.first.size), cells.second] = -1.0
        self.incidence, self.row_incidence = incidence, incidence[self.row_pair]
        self.half_row_incidence32 = (0.5 * self.row_incidence).astype(np.float32)
        self.prior_games = cells.prior_games
        self.step_matrix = np.linalg.inv(fit.hessian + fit.gauge)

    @property
    def chunk(self) -> int:
        """Rounds refitted together."""
        return int(np.clip(self.BUFFER_ENTRIES // (self.rows * self.width), 1, 16))

    def weights(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """[size, padded entries] Poisson-bootstrap weights."""
        weights = poisson_one(rng, (size, self.rows * self.width))
        # The padding's draws stay: every product that reads the weights has a factor 0 there.
        if self.others.size:
            weights[:, self.others] = rng.poisson(self.other_counts, size=(size, self.others.size))
        return weights

    def _step(self, params: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """The chord step from the rounds' weighted residuals ([size, padded entries])."""
        n = self.n
        # Row sums as a matrix-vector product: BLAS reads the rows at memory speed.
        per_row = (residual.reshape(-1, self.width) @ self.ones_row).reshape(-1, self.rows).astype(float)
        prior_p = 1.0 / (1.0 + np.exp(-(params[:, :n] @ self.incidence.T)))
        strengths = per_row @ self.row_incidence + (self.prior_games * (0.5 - prior_p)) @ self.incidence
        gradient = np.concatenate([strengths, residual @ self.features], axis=1)
        return gradient @ self.step_matrix

    def rounds(self, seed: np.random.SeedSequence, size: int) -> np.ndarray:
        """``size`` rounds' parameters: [size, models + features]."""
        n = self.n
        weights = self.weights(np.random.default_rng(seed), size)
        logit = np.multiply(weights, self.residual)
        params = np.broadcast_to(self.fit.params, (size, self.step_matrix.shape[0])).copy()
        step = self._step(params, logit)
        weights *= self.half_mask  # w / 2, 0 in the padding; in place: w is not needed any more.
        done = np.zeros(size, dtype=bool)
        previous = np.full(size, np.nan)  # The step before, per round: none yet.
        for _ in range(self.CHORD_ITERATIONS):
            params += step
            params[:, :n] -= params[:, :n].mean(axis=1, keepdims=True)
            moved = np.max(np.abs(step), axis=1)
            # The chord iteration contracts the error by a rate q each step, so after a step of
            # size s the error left is at most s q / (1 - q) (a posteriori bound for a
            # contraction), with q estimated from the last two steps; a step below the tolerance
            # ends a round too, as in the plain board's rounds. Typically the bound ends the
            # rounds one iteration earlier.
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = moved / previous
                done = (moved < self.TOLERANCE) | ((rate < 0.5) & (moved * rate / (1.0 - rate) < self.TOLERANCE))
            previous = moved
            if done.all():
                return params
            np.matmul(params[:, n:].astype(np.float32), self.half_features_t, out=logit)
            rows = logit.reshape(size, self.rows, self.width)
            rows += (params[:, :n].astype(np.float32) @ self.half_row_incidence32.T)[:, :, None]
            np.tanh(logit, out=logit)  # tanh(logit / 2): the halves are in the factors.
            np.subtract(self.twice_centred_score, logit, out=logit)
            logit *= weights  # w / 2 (2y - 1 - tanh(logit / 2)) = w (y - sigmoid(logit)).
            step = self._step(params, logit)
        for index in np.flatnonzero(~done):
            params[index] = self._full_fit(2.0 * weights[index, self.slot])
        return params

    def _full_fit(self, weights: np.ndarray) -> np.ndarray:
        """One round refitted by full Newton: its cells with the resampled counts."""
        cells = self.fit.cells
        counts = np.zeros((3, cells.features.shape[0]))
        np.add.at(counts, (self.outcome, self.cell), weights)
        resampled = StyleOutcomes(self.n, cells.first[cells.group], cells.second[cells.group], cells.features, *counts)
        return _fit(resampled, cells.prior).params


def conv_metadata(replies_a: Sequence[tuple[str, int | None]], replies_b: Sequence[tuple[str, int | None]]) -> dict:
    """The style fields of LMArena's public releases (``conv_metadata``) for two sides' replies,
    each (text, tokens or None): summed tokens and markdown counts per side."""
    meta: dict[str, object] = {}
    for side, replies in (("a", replies_a), ("b", replies_b)):
        headers = lists = bold = 0
        tokens = 0.0
        for text, count in replies:
            length, h, li, b = style_of(text, count)
            tokens += length
            headers, lists, bold = headers + int(h), lists + int(li), bold + int(b)
        meta[f"sum_assistant_{side}_tokens"] = round(tokens)
        meta[f"header_count_{side}"] = headers
        meta[f"list_count_{side}"] = lists
        meta[f"bold_count_{side}"] = bold
    return meta


def _count(value: object) -> float:
    """A count as LMArena's releases give it: a number, or a dict of numbers (by header level,
    list kind or bold marker) to add up."""
    if isinstance(value, dict):
        return float(sum(_count(v) for v in value.values()))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a count, got {value!r}")
    return float(value)


def differences_from_metadata(meta: object) -> np.ndarray:
    """The style differences of side a against side b from a ``conv_metadata`` object."""
    if not isinstance(meta, dict):
        raise ValueError("conv_metadata is not an object")
    sides = []
    for side in ("a", "b"):
        keys = (f"sum_assistant_{side}_tokens", f"header_count_{side}", f"list_count_{side}", f"bold_count_{side}")
        missing = [key for key in keys if key not in meta]
        if missing:
            raise ValueError(f"conv_metadata lacks {', '.join(missing)}")
        sides.append([_count(meta[key]) for key in keys])
    return differences(sides[0], sides[1])
