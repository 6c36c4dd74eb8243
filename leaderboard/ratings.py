"""Rating math: Bradley-Terry with confidence intervals, online Elo, ranks, fix rates. No Django.

Models are indices 0..n-1. Everything Bradley-Terry needs is the matrix of pairwise scores
``wins[i, j]``: how often i beat j, a tie (or "both bad") counting half a win for each side, as
in Chatbot Arena. Votes reduce to it once (the database does that); the fit, the intervals and
the matrices then cost the same whatever the number of votes.

Ratings are on the Elo scale: 1000 + 400·log10(strength), strengths centred so that their
geometric mean is 1 (the ratings average 1000).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

ELO_SCALE = 400.0
BASE_RATING = 1000.0
_TO_RATING = ELO_SCALE / np.log(10.0)  # Natural-log strength -> rating points.
Z_95 = 1.959963984540054
_CHUNK = 250  # Bootstrap rounds per task of the thread pool.
# Bootstrap pairs whose three cells all hold at least this many votes draw their Poisson counts
# from the normal approximation, several times cheaper (see ``_RoundFit``).
NORMAL_FROM = 10.0

# The score of model A for each vote choice. "Both bad" is a tie: neither side won.
VOTE_SCORES = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}
# The default prior: one virtual tied game per model in all, spread over its pairs. It keeps an
# unbeaten model's rating finite, and weighs like one vote whatever the number of models. (A
# fixed half game per pair, the earlier default, gave a model 20 virtual ties among 41 models:
# a model truly +200 showed at +117 after 30 votes, and its interval held the truth 36% of
# the time; tests/test_ratings.py checks the coverage of this one by simulation.)
PRIOR_GAMES_PER_MODEL = 1.0


def default_prior(n_models: int) -> float:
    """Virtual tied games per pair that add up to ``PRIOR_GAMES_PER_MODEL`` per model."""
    return PRIOR_GAMES_PER_MODEL / max(n_models - 1, 1)


def win_matrix(n_models: int, games: Iterable[tuple[int, int, float]]) -> np.ndarray:
    """wins[i, j] = how often i beat j, ties counted as half a win for each side."""
    wins = np.zeros((n_models, n_models))
    for a, b, score_a in games:
        if a == b:
            raise ValueError("A model cannot play itself.")
        wins[a, b] += score_a
        wins[b, a] += 1.0 - score_a
    return wins


@dataclass(frozen=True)
class PairOutcomes:
    """The sufficient statistics of a set of votes: per unordered pair (i < j), how often i
    won, j won, and they tied. Bootstrap resampling draws from these cells."""

    n_models: int
    first: np.ndarray  # i, per pair
    second: np.ndarray  # j, per pair
    first_wins: np.ndarray
    second_wins: np.ndarray
    ties: np.ndarray

    @classmethod
    def from_games(cls, n_models: int, games: Iterable[tuple[int, int, float]]) -> PairOutcomes:
        """From (model a, model b, score of a) triples; a score of 0.5 is a tie."""
        cells: dict[tuple[int, int], list[float]] = {}
        for a, b, score in games:
            if a == b:
                raise ValueError("A model cannot play itself.")
            i, j, score_i = (a, b, score) if a < b else (b, a, 1.0 - score)
            cell = cells.setdefault((i, j), [0.0, 0.0, 0.0])
            cell[0 if score_i == 1.0 else 1 if score_i == 0.0 else 2] += 1
        return cls.from_cells(n_models, cells)

    @classmethod
    def from_cells(cls, n_models: int, cells: dict[tuple[int, int], Sequence[float]]) -> PairOutcomes:
        """From {(i, j): (wins of i, wins of j, ties)} with i < j (what a GROUP BY returns)."""
        keys = sorted(cells)
        if any(i >= j or i < 0 or j >= n_models for i, j in keys):
            raise ValueError("Pairs must be (i, j) with 0 <= i < j < n_models.")
        values = np.array([cells[key] for key in keys], dtype=float).reshape(-1, 3)
        return cls(
            n_models,
            np.array([i for i, _ in keys], dtype=np.intp),
            np.array([j for _, j in keys], dtype=np.intp),
            values[:, 0],
            values[:, 1],
            values[:, 2],
        )

    @property
    def total(self) -> float:
        return float(self.first_wins.sum() + self.second_wins.sum() + self.ties.sum())

    def wins(self, weights: np.ndarray | None = None) -> np.ndarray:
        """The pairwise score matrix, optionally with a weight per pair."""
        scale = 1.0 if weights is None else weights
        wins = np.zeros((self.n_models, self.n_models))
        wins[self.first, self.second] = (self.first_wins + self.ties / 2.0) * scale
        wins[self.second, self.first] = (self.second_wins + self.ties / 2.0) * scale
        return wins

    def games(self) -> np.ndarray:
        """games[i, j] = votes between i and j (symmetric)."""
        count = np.zeros((self.n_models, self.n_models))
        total = self.first_wins + self.second_wins + self.ties
        count[self.first, self.second] = total
        count[self.second, self.first] = total
        return count

    def played(self) -> np.ndarray:
        """Per model, whether it has a vote: only those can be rated."""
        return self.games().sum(axis=1) > 0

    def restricted(self, keep: np.ndarray) -> PairOutcomes:
        """The outcomes among the models where ``keep`` is true, renumbered in their order."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.n_models,):
            raise ValueError("keep needs one flag per model.")
        new_index = np.cumsum(keep) - 1
        inside = keep[self.first] & keep[self.second]
        return PairOutcomes(
            int(keep.sum()),
            new_index[self.first[inside]],
            new_index[self.second[inside]],
            self.first_wins[inside],
            self.second_wins[inside],
            self.ties[inside],
        )


def _fit_log_strengths(
    wins: np.ndarray, prior: float, *, start: np.ndarray | None = None, iterations: int = 100, tol: float = 1e-10
) -> np.ndarray:
    """Centred natural-log strengths maximising the Bradley-Terry likelihood, by Newton's
    method; ``wins`` may be a batch (..., n, n) of score matrices, fitted together.

    ``prior`` adds that many virtual tied games between every pair (0: the plain MLE).
    ``start`` is a first guess (the full-data fit, for bootstrap samples: two steps then do).
    """
    n = wins.shape[-1]
    regularised = wins + (prior / 2.0) * (1.0 - np.eye(n))
    games = regularised + np.swapaxes(regularised, -1, -2)
    theta = np.zeros(wins.shape[:-1]) if start is None else np.broadcast_to(start, wins.shape[:-1]).copy()
    centring = np.full((n, n), 1.0 / n)
    diagonal = np.arange(n)
    for _ in range(iterations):
        p = np.exp(theta[..., None, :] - theta[..., :, None])
        p += 1.0
        np.reciprocal(p, out=p)  # P(i beats j), in place: the batch is large.
        expected = games * p
        gradient = regularised.sum(axis=-1) - expected.sum(axis=-1)
        p -= 1.0
        expected *= p  # -games * p * (1 - p): the off-diagonal of the Laplacian.
        laplacian = expected
        laplacian[..., diagonal, diagonal] = 0.0
        laplacian[..., diagonal, diagonal] = -laplacian.sum(axis=-1)
        # The likelihood ignores a common shift: fixing the mean makes the system regular.
        step = np.linalg.solve(laplacian + centring, gradient[..., None])[..., 0]
        step = np.clip(step, -5.0, 5.0)  # A model that never lost drifts up; keep steps sane.
        theta = theta + step
        theta -= theta.mean(axis=-1, keepdims=True)
        if np.max(np.abs(step), initial=0.0) < tol:
            break
    return theta


def bradley_terry(wins: np.ndarray, *, prior: float | None = None) -> np.ndarray:
    """Bradley-Terry ratings (Elo scale, mean 1000) fitted by maximum likelihood.

    ``prior`` adds that many virtual tied games between every pair of models: it keeps the
    estimate finite for an unbeaten model (``prior=0`` is the plain MLE; None, the default,
    ``default_prior``: one virtual game per model in all).
    """
    n = wins.shape[0]
    if wins.shape != (n, n):
        raise ValueError("wins must be a square matrix.")
    if n == 0:
        return np.zeros(0)
    return BASE_RATING + _TO_RATING * _fit_log_strengths(wins, _prior(prior, n))


def _prior(prior: float | None, n_models: int) -> float:
    return default_prior(n_models) if prior is None else prior


@dataclass(frozen=True)
class RatingsWithIntervals:
    ratings: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    ranks: np.ndarray
    method: str


def bootstrap_intervals(
    outcomes: PairOutcomes,
    *,
    rounds: int = 1000,
    seed: int = 0,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
    level: float = 0.95,
) -> RatingsWithIntervals:
    """Ratings with percentile intervals from ``rounds`` Poisson-bootstrap resamplings of the
    votes, each refitted to convergence.

    The Poisson bootstrap gives every vote an independent Poisson(1) weight (Hanley & MacGibbon
    2006; Chamandy et al. 2012), so a (pair, outcome) cell of c votes becomes a Poisson(c) draw:
    the cells are resampled independently, at a cost that does not grow with the number of votes.
    Each round is refitted to convergence by Newton's chord method from the full-data fit
    (``_RoundFit``).
    """
    weights = _checked_weights(outcomes, pair_weights)
    n = outcomes.n_models
    prior = _prior(prior, n)
    ratings = bradley_terry(outcomes.wins(weights), prior=prior)
    if round(outcomes.total) == 0 or rounds < 1:
        return RatingsWithIntervals(
            ratings, ratings.copy(), ratings.copy(), ranks_from_intervals(ratings, ratings), "bootstrap"
        )
    theta = (ratings - BASE_RATING) / _TO_RATING
    fit = _RoundFit(outcomes, weights, prior, theta)

    def chunk(seed_sequence: np.random.SeedSequence, size: int) -> np.ndarray:
        return fit.refit(fit.resample(seed_sequence, size))

    # Fixed chunks with their own seeds: the same result whatever the number of threads, and
    # numpy's sampling, arithmetic and LAPACK release the GIL, so the cores share the work.
    # BLAS keeps to one thread meanwhile: its threads inside each chunk's products (this small)
    # would contend with the chunks' for the cores (measured on 2 cores, 7 boards of 1000
    # rounds: a median of 0.09 s against 0.13 s, the slowest of seven 0.12 s against 0.26 s).
    sizes = [min(_CHUNK, rounds - first) for first in range(0, rounds, _CHUNK)]
    seeds = np.random.SeedSequence(seed).spawn(len(sizes))
    workers = min(len(sizes), os.cpu_count() or 1)
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=workers) as pool:
        fitted = BASE_RATING + _TO_RATING * np.concatenate(list(pool.map(chunk, seeds, sizes)))
    tail = (1.0 - level) / 2.0 * 100.0
    lower, upper = np.percentile(fitted, [tail, 100.0 - tail], axis=0)
    return RatingsWithIntervals(ratings, lower, upper, ranks_from_intervals(lower, upper), "bootstrap")


@functools.lru_cache(maxsize=8)
def _standard_normals(entropy: int, spawn_key: tuple[int, ...], size: int, pairs: int) -> np.ndarray:
    """The normal draws of one chunk of rounds, shared by every board refreshed with the same
    seed and number of models: they are what each board would draw from that seed anyway (a
    board's intervals are its own; no statement is made across boards), generated once. Single
    precision: this memory-bound step moves half the bytes."""
    seed = np.random.SeedSequence(entropy, spawn_key=spawn_key)
    noise = np.random.default_rng(seed).standard_normal((2, size, pairs), dtype=np.float32)
    noise.flags.writeable = False
    return noise


class _RoundFit:
    """Bootstrap rounds of one board, in pair form: every unordered pair i < j (the prior's
    virtual ties reach pairs with no votes too) with, per round, its score for i and its games.

    Resampling: the Poisson bootstrap makes each (pair, outcome) cell of c votes a Poisson(c)
    draw. Where a pair's three cells all hold at least ``NORMAL_FROM`` votes, the draws come from
    their normal approximation (same mean and variance), and since only the pair's score and games
    enter the fit, those two are drawn directly as a correlated normal pair: two draws instead of
    three Poisson ones, several times cheaper. A rating sums the noise of the 3(n - 1) cells of
    its pairs, so what the approximation changes (each cell's skewness, at most 1/sqrt(10)) is
    diluted to nothing the percentiles can see; tests/test_ratings.py compares the intervals
    with the all-Poisson ones.

    Refitting: Newton's chord method keeps the full-data fit's Hessian for every round and
    iteration: theta += H^-1 gradient(theta), whose fixed point is the round's own maximum
    likelihood (the gradient is exact; only the step's matrix is frozen). A resampled Hessian
    differs from the full-data one by about 1/sqrt(votes per pair), so the error shrinks by that
    factor each iteration: a few matrix products per round, instead of a batched solve per round
    and iteration. Rounds not converged after ``CHORD_ITERATIONS`` (a board of a handful of
    votes) finish with full Newton steps.
    """

    CHORD_ITERATIONS = 30
    # In log strength: 0.0035 rating points, against the page's 0.1: the bound on the error left
    # after the last step (``refit``).
    TOLERANCE = 2e-5

    def __init__(self, outcomes: PairOutcomes, weights: np.ndarray | None, prior: float, theta: np.ndarray) -> None:
        n = outcomes.n_models
        self.n, self.prior, self.theta = n, prior, theta
        first, second = np.triu_indices(n, 1)
        pairs = first.size
        position = np.full((n, n), -1, dtype=np.intp)
        position[first, second] = np.arange(pairs)
        at = position[outcomes.first, outcomes.second]
        cells = np.zeros((3, pairs))  # First wins, second wins, ties: per pair, 0 where unplayed.
        np.add.at(cells, (slice(None), at), np.stack([outcomes.first_wins, outcomes.second_wins, outcomes.ties]))
        self.scale = np.ones(pairs)
        if weights is not None:
            self.scale[at] = weights
        wins_i, _, ties = cells
        self.score, self.games = wins_i + ties / 2.0, cells.sum(axis=0)
        small = (cells > 0) & (cells < NORMAL_FROM)
        self.exact = np.flatnonzero(small.any(axis=0))
        self.exact_cells = cells[:, self.exact]
        # score = wins_i + ties/2 and games = wins_i + wins_j + ties, each cell ~ N(c, c):
        # score = S + a z1, games = G + b z1 + c z2 with a^2 = Var(score), a b = Cov, b^2 + c^2 =
        # Var(games).
        variance_score = wins_i + ties / 4.0
        self.a = np.sqrt(variance_score)
        self.b = np.divide(wins_i + ties / 2.0, self.a, out=np.zeros(pairs), where=self.a > 0)
        self.c = np.sqrt(np.maximum(self.games - self.b**2, 0.0))
        self.a[self.exact] = self.b[self.exact] = self.c[self.exact] = 0.0
        incidence = np.zeros((pairs, n))
        incidence[np.arange(pairs), first] = 1.0
        incidence[np.arange(pairs), second] = -1.0
        self.incidence = incidence
        p = 1.0 / (1.0 + np.exp(theta[second] - theta[first]))
        hessian = _laplacian(n, first, second, (self.games * self.scale + prior) * p * (1.0 - p)) + 1.0 / n
        self.step_matrix = np.linalg.inv(hessian)  # The centring term fixes the free common shift.
        self.first, self.second = first, second

    def resample(self, seed: np.random.SeedSequence, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``size`` rounds of (score of i, games) per pair, weighted and with the prior."""
        normal_seed, poisson_seed = seed.spawn(2)
        noise = _standard_normals(normal_seed.entropy, normal_seed.spawn_key, size, self.score.size)
        # Single precision throughout, as the refit reads them: counts stay exact to 2**24, and
        # the draws' fractions need no more.
        a, b, c, mean_score, mean_games, scale = (
            values.astype(np.float32) for values in (self.a, self.b, self.c, self.score, self.games, self.scale)
        )
        score = noise[0] * a
        score += mean_score
        games = noise[0] * b
        games += noise[1] * c
        games += mean_games
        np.maximum(games, 0.0, out=games)
        np.clip(score, 0.0, games, out=score)
        if self.exact.size:
            draws = np.random.default_rng(poisson_seed).poisson(self.exact_cells, size=(size, *self.exact_cells.shape))
            wins_i, wins_j, ties = draws.transpose(1, 0, 2)
            score[:, self.exact] = wins_i + ties / 2.0
            games[:, self.exact] = wins_i + wins_j + ties
        score *= scale
        games *= scale
        score += np.float32(self.prior / 2.0)
        games += np.float32(self.prior)
        return score, games

    def refit(self, rounds: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Each round's centred log strengths."""
        score, games = rounds
        # The residuals in single precision (twice as fast, memory-bound): their rounding moves
        # a round's fixed point by about 1e-7 in log strength, below the tolerance.
        score32, games32 = np.asarray(score, dtype=np.float32), np.asarray(games, dtype=np.float32)
        incidence32 = self.incidence.astype(np.float32)
        theta = np.broadcast_to(self.theta, (score.shape[0], self.n)).copy()
        # The first step starts from the full-data fit, where P(i beats j) is the same in every
        # round: its residual is score - games * P without a product or an exponential.
        at_fit = 1.0 / (1.0 + np.exp(self.theta[self.second] - self.theta[self.first]))
        residual = games32 * at_fit.astype(np.float32)
        np.subtract(score32, residual, out=residual)
        previous = np.full(score.shape[0], np.nan)  # Each round's step before: none yet.
        for _ in range(self.CHORD_ITERATIONS):
            step = (residual @ incidence32).astype(float) @ self.step_matrix
            theta += step
            theta -= theta.mean(axis=1, keepdims=True)
            # The chord iteration contracts a round's error by a rate q a step, so after a step
            # of size s the error left is at most s q / (1 - q) (the a-posteriori bound of a
            # contraction), q estimated from the round's last two steps: typically one iteration
            # fewer than waiting for a step below the tolerance.
            moved = np.max(np.abs(step), axis=1, initial=0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = moved / previous
                done = (moved < self.TOLERANCE) | ((rate < 0.5) & (moved * rate / (1.0 - rate) < self.TOLERANCE))
            if done.all():
                return theta
            previous = moved
            # P(i beats j) per round and pair, then the residual score - games * P, in place.
            residual = (theta @ self.incidence.T).astype(np.float32)
            np.negative(residual, out=residual)
            np.exp(residual, out=residual)
            residual += np.float32(1.0)
            np.reciprocal(residual, out=residual)
            residual *= games32
            np.subtract(score32, residual, out=residual)
        wins = np.zeros((score.shape[0], self.n, self.n))
        wins[:, self.first, self.second] = score - self.prior / 2.0
        wins[:, self.second, self.first] = games - score - self.prior / 2.0
        return _fit_log_strengths(wins, self.prior, start=theta, tol=self.TOLERANCE)


def sandwich_intervals(
    outcomes: PairOutcomes, *, prior: float | None = None, pair_weights: np.ndarray | None = None, level: float = 0.95
) -> RatingsWithIntervals:
    """Ratings with Huber-White (sandwich) intervals: robust to a misspecified model (ties,
    voters who disagree), from the cell counts in closed form.

    The fit is a logistic regression of the outcome (1, 0, or ½ for a tie) on e_i − e_j; the
    bread is the Fisher information, the meat the outer product of the per-vote scores.
    """
    weights = _checked_weights(outcomes, pair_weights)
    scale = np.ones(outcomes.first.size) if weights is None else weights
    theta = _fit_log_strengths(outcomes.wins(weights), _prior(prior, outcomes.n_models))
    i, j = outcomes.first, outcomes.second
    p = 1.0 / (1.0 + np.exp(theta[j] - theta[i]))
    games = outcomes.first_wins + outcomes.second_wins + outcomes.ties
    bread = _laplacian(outcomes.n_models, i, j, scale * games * p * (1.0 - p))
    squared = outcomes.first_wins * (1.0 - p) ** 2 + outcomes.second_wins * p**2 + outcomes.ties * (0.5 - p) ** 2
    meat = _laplacian(outcomes.n_models, i, j, scale**2 * squared)
    inverse = np.linalg.pinv(bread)  # The centred gauge: the null space is the common shift.
    covariance = inverse @ meat @ inverse
    ratings = BASE_RATING + _TO_RATING * theta
    half = _z(level) * _TO_RATING * np.sqrt(np.maximum(np.diag(covariance), 0.0))
    lower, upper = ratings - half, ratings + half
    return RatingsWithIntervals(ratings, lower, upper, ranks_from_intervals(lower, upper), "sandwich")


@dataclass(frozen=True)
class VoterCells:
    """The votes per (voter, pair, outcome): what a cluster-robust interval needs besides the
    pair counts. A voter's votes share the voter's taste, so they are not independent pieces of
    evidence; the voter is the cluster. Models are indices as in ``PairOutcomes`` (i < j)."""

    n_models: int
    voter: np.ndarray  # A code per row (any non-negative integers).
    first: np.ndarray
    second: np.ndarray
    outcome: np.ndarray  # 0: the first won, 1: the second won, 2: a tie.
    count: np.ndarray

    @classmethod
    def from_votes(cls, n_models: int, votes: Iterable[tuple[int, int, int, float]]) -> VoterCells:
        """From (voter code, model a, model b, score of a) votes, one row each."""
        rows = np.array(list(votes), dtype=float).reshape(-1, 4)
        a, b, score = rows[:, 1].astype(np.intp), rows[:, 2].astype(np.intp), rows[:, 3]
        score_first = np.where(a < b, score, 1.0 - score)
        return cls(
            n_models,
            rows[:, 0].astype(np.intp),
            np.minimum(a, b),
            np.maximum(a, b),
            np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2)),
            np.ones(len(rows)),
        )

    def outcomes(self) -> PairOutcomes:
        """The pair counts, summed over voters."""
        n = self.n_models
        cells = np.bincount((self.first * n + self.second) * 3 + self.outcome, self.count, n * n * 3).reshape(-1, 3)
        pairs = np.flatnonzero(cells.sum(axis=1))
        kept = cells[pairs]
        return PairOutcomes(n, pairs // n, pairs % n, kept[:, 0], kept[:, 1], kept[:, 2])

    def restricted(self, keep: np.ndarray) -> VoterCells:
        """The rows among the models where ``keep`` is true, renumbered in their order."""
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return self
        inside, first, second = rows_within(keep, self.first, self.second)
        return VoterCells(int(keep.sum()), self.voter[inside], first, second, self.outcome[inside], self.count[inside])


def rows_within(keep: np.ndarray, first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of rows between models ``first`` and ``second``: which lie among the models ``keep``
    selects, and their models renumbered in the kept models' order."""
    new_index = np.cumsum(keep) - 1
    inside = keep[first] & keep[second]
    return inside, new_index[first[inside]], new_index[second[inside]]


CLUSTERED = "voter-clustered"  # The method's name, as snapshots store it.


def clustered_intervals(
    outcomes: PairOutcomes,
    voters: VoterCells,
    *,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
    level: float = 0.95,
) -> RatingsWithIntervals:
    """Ratings with cluster-robust (sandwich) intervals, the voter as the cluster: the votes of
    one voter share that voter's taste, and counting them as independent evidence makes the
    intervals too narrow when voters differ (tests/test_rating_intervals.py).

    The fit is the penalised Bradley-Terry of ``outcomes`` (which must be ``voters`` summed over
    voters). The bread is the penalised likelihood's Hessian; the meat sums, over voters, the
    outer product of each voter's score (the sum over the voter's votes of the vote's residual
    times e_i - e_j), with the small-sample factor G / (G - 1) for G voters: O(rows) in all.
    Each model's variance is at least the one that counts every vote as independent (the
    vote-level sandwich), so that a board of a few voters, whose cluster estimate is noisy, is
    not made more certain by clustering.
    """
    weights = _checked_weights(outcomes, pair_weights)
    n = outcomes.n_models
    prior = _prior(prior, n)
    scale = np.ones(outcomes.first.size) if weights is None else weights
    theta = _fit_log_strengths(outcomes.wins(weights), prior)
    ratings = BASE_RATING + _TO_RATING * theta
    if n < 2 or round(outcomes.total) == 0:
        return RatingsWithIntervals(
            ratings, ratings.copy(), ratings.copy(), ranks_from_intervals(ratings, ratings), CLUSTERED
        )
    i, j = outcomes.first, outcomes.second
    p = 1.0 / (1.0 + np.exp(theta[j] - theta[i]))
    games = outcomes.first_wins + outcomes.second_wins + outcomes.ties
    every_first, every_second = np.triu_indices(n, 1)
    p_every = 1.0 / (1.0 + np.exp(theta[every_second] - theta[every_first]))
    bread = _laplacian(n, i, j, scale * games * p * (1.0 - p))
    bread += _laplacian(n, every_first, every_second, prior * p_every * (1.0 - p_every))
    inverse = np.linalg.pinv(bread)  # The centred gauge: the null space is the common shift.
    squared = outcomes.first_wins * (1.0 - p) ** 2 + outcomes.second_wins * p**2 + outcomes.ties * (0.5 - p) ** 2
    vote_level = np.diag(inverse @ _laplacian(n, i, j, scale**2 * squared) @ inverse)
    # Per row: its votes' residual, weighted as their pair is.
    pair_weight = np.ones((n, n))
    pair_weight[i, j] = scale
    vi, vj = voters.first, voters.second
    p_row = 1.0 / (1.0 + np.exp(theta[vj] - theta[vi]))
    residual = voters.count * pair_weight[vi, vj] * (np.array([1.0, 0.0, 0.5])[voters.outcome] - p_row)
    meat = _cluster_meat(voters.voter, vi, vj, residual, n)
    clustered = np.diag(inverse @ meat @ inverse)
    half = _z(level) * _TO_RATING * np.sqrt(np.maximum(np.maximum(clustered, vote_level), 0.0))
    lower, upper = ratings - half, ratings + half
    return RatingsWithIntervals(ratings, lower, upper, ranks_from_intervals(lower, upper), CLUSTERED)


@dataclass(frozen=True)
class BoardFit:
    """A board's ratings as the data supports them (``rate_board``), per model:

    - ``group``: its component of the comparison graph (0: the largest). Models of different
      groups never met, directly or through other models: their ratings are on scales of their
      own, and ranks count within a group only;
    - ``upper_open`` / ``lower_open``: the votes put no bound on that side (an unbeaten model,
      or a set of models that never lost a vote to the rest of their group: above; one that
      never won: below). The bound is then infinite, and ``ratings`` holds the finite one;
    - ``ranks``: 1 + the models of its group whose lower bound is above its upper bound.
    - ``fitted``: the penalised fit's point (for ordering rows only: for an open-ended model it
      is set by the prior, not by the data).
    """

    ratings: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    ranks: np.ndarray
    group: np.ndarray
    upper_open: np.ndarray
    lower_open: np.ndarray
    fitted: np.ndarray
    method: str


def comparison_groups(outcomes: PairOutcomes) -> np.ndarray:
    """Each model's component of the graph of pairs that met, numbered by size (0: the largest;
    equal sizes by their first model)."""
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(outcomes.games() > 0, directed=False)
    order = sorted(set(labels.tolist()), key=lambda label: (-(labels == label).sum(), np.argmax(labels == label)))
    renumber = np.empty(len(order), dtype=np.intp)
    renumber[order] = np.arange(len(order))
    return renumber[labels]


def open_ends(outcomes: PairOutcomes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(upper open, lower open, component) per model of one connected group: the sides on which
    the votes put no bound. Draw an arrow i -> j when i scored against j (a win or a tie). The
    Bradley-Terry maximum exists when every model reaches every other (one strongly connected
    component); otherwise the components drift apart without bound. Where one component is
    larger than every other and holds two models or more, it is the reference (the settled
    models): another component is open above when the reference never reaches it (never beat
    it, directly or through others), open below when it never reaches the reference. Else
    (every component one model, as after a few decisive votes): a component no arrow enters
    (it never lost a vote) is open above, one no arrow leaves (it never won one) open below."""
    from scipy.sparse.csgraph import breadth_first_order, connected_components

    scored = outcomes.wins() > 0
    count, labels = connected_components(scored, directed=True, connection="strong")
    upper, lower = np.zeros(outcomes.n_models, bool), np.zeros(outcomes.n_models, bool)
    if count < 2:
        return upper, lower, labels
    sizes = np.bincount(labels, minlength=count)
    largest = np.flatnonzero(sizes == sizes.max())
    if sizes.max() >= 2 and largest.size == 1:
        start = int(np.flatnonzero(labels == largest[0])[0])
        reached = np.zeros(outcomes.n_models, bool)
        reached[breadth_first_order(scored, start, directed=True, return_predecessors=False)] = True
        reaching = np.zeros(outcomes.n_models, bool)
        reaching[breadth_first_order(scored.T, start, directed=True, return_predecessors=False)] = True
        return ~reached, ~reaching, labels
    for label in range(count):
        inside = labels == label
        upper[inside] = not scored[np.ix_(~inside, inside)].any()
        lower[inside] = not scored[np.ix_(inside, ~inside)].any()
    return upper, lower, labels


def _open_shift(differences: np.ndarray, games: np.ndarray, level: float) -> float:
    """The shift s at which the chance of winning every one of these games, prod sigma(differences
    + s) ** games, falls to (1 - level) / 2: the exact one-sided bound (as Clopper-Pearson's for a
    proportion with no failure) of a set of models that won them all, the others' ratings held at
    their estimates. Below it, a clean sweep would have had less than a 2.5% chance."""
    target = float(np.log((1.0 - level) / 2.0))

    def loglik(shift: float) -> float:
        return float(-(games * np.logaddexp(0.0, -(differences + shift))).sum())

    low, high = -60.0, 60.0
    for _ in range(80):
        middle = (low + high) / 2.0
        if loglik(middle) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def rate_board(
    outcomes: PairOutcomes,
    *,
    ci: str = "bootstrap",
    voters: VoterCells | None = None,
    rounds: int = 1000,
    seed: int = 0,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
    level: float = 0.95,
) -> BoardFit:
    """Ratings, intervals and ranks of models that each have a vote, claiming no more than the
    votes support:

    - each group of models that met (``comparison_groups``) is fitted on its own, its ratings
      averaging 1000, and ranked within itself;
    - an open-ended side (``open_ends``) gets an infinite bound; the finite one is the
      exact one-sided bound of the model's set against the rest of its group, their ratings
      held at their estimates (``_open_shift``), and shown as the model's rating; the group's
      ratings are centred on its settled models (those with both bounds) where it has any;
    - ``ci``: "bootstrap" (``bootstrap_intervals``), "sandwich" (``sandwich_intervals``) or
      "clustered" (``clustered_intervals``, which needs ``voters``).
    """
    n = outcomes.n_models
    weights = None if pair_weights is None else np.asarray(pair_weights, dtype=float)
    group = comparison_groups(outcomes) if n else np.zeros(0, dtype=np.intp)
    result = {name: np.zeros(n) for name in ("ratings", "lower", "upper", "fitted")}
    ranks = np.ones(n, dtype=np.intp)
    upper_open, lower_open = np.zeros(n, bool), np.zeros(n, bool)
    method = ci
    for label in range(int(group.max(initial=-1)) + 1):
        keep = group == label
        inside = keep[outcomes.first] & keep[outcomes.second]
        sub = outcomes.restricted(keep)
        sub_weights = None if weights is None else weights[inside]
        if ci == "bootstrap":
            fit = bootstrap_intervals(sub, rounds=rounds, seed=seed, prior=prior, pair_weights=sub_weights, level=level)
        elif ci == "sandwich":
            fit = sandwich_intervals(sub, prior=prior, pair_weights=sub_weights, level=level)
        elif ci == "clustered":
            if voters is None:
                raise ValueError("Intervals clustered by voter need the votes per voter.")
            fit = clustered_intervals(sub, voters.restricted(keep), prior=prior, pair_weights=sub_weights, level=level)
        else:
            raise ValueError(f"Unknown interval method {ci!r}.")
        method = fit.method
        point, lower, upper = fit.ratings.copy(), fit.lower.copy(), fit.upper.copy()
        shown, point, lower, upper, above, below = settle_open_ends(sub, sub_weights, point, lower, upper, level)
        result["ratings"][keep], result["lower"][keep], result["upper"][keep] = shown, lower, upper
        result["fitted"][keep] = point
        ranks[keep] = ranks_from_intervals(lower, upper)
        upper_open[keep], lower_open[keep] = above, below
    return BoardFit(
        result["ratings"],
        result["lower"],
        result["upper"],
        ranks,
        group,
        upper_open,
        lower_open,
        result["fitted"],
        method,
    )


def settle_open_ends(
    outcomes: PairOutcomes,
    pair_weights: np.ndarray | None,
    point: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A connected group's fit (ratings ``point`` with their bounds) as the votes support it:
    (shown, point, lower, upper, upper open, lower open). An open side (``open_ends``) becomes
    infinite; the finite one is the exact one-sided bound of the model's component against the
    rest of the group, their ratings held at their estimates (``_open_shift``), and is what the
    model's row shows; the ratings are centred on the settled models where there are any."""
    point, lower, upper = point.copy(), lower.copy(), upper.copy()
    above, below, components = open_ends(outcomes)
    if not (above.any() or below.any()):
        return point, point, lower, upper, above, below
    theta = (point - BASE_RATING) / _TO_RATING
    games = outcomes.games() * _weight_matrix(outcomes, _checked_weights(outcomes, pair_weights))
    scored = outcomes.wins() > 0
    for label in sorted(set(components[above | below].tolist())):
        members = components == label
        rest = ~members
        # Pairs across components went one way: won by the members (they bound them below) or
        # lost (above).
        won = games[np.ix_(members, rest)] * scored[np.ix_(members, rest)]
        lost = games[np.ix_(members, rest)] * scored[np.ix_(rest, members)].T
        gap = theta[members][:, None] - theta[rest][None, :]
        floor = BASE_RATING + _TO_RATING * (theta[members] + _open_shift(gap.ravel(), won.ravel(), level))
        ceiling = BASE_RATING + _TO_RATING * (theta[members] - _open_shift(-gap.ravel(), lost.ravel(), level))
        if above[members].all() and below[members].all():
            # Never met the reference either way (below a model above it, say): no bound at all.
            lower[members], upper[members] = -np.inf, np.inf
        elif above[members].all():
            upper[members] = np.inf
            lower[members] = floor if won.any() else -np.inf
        elif below[members].all():
            lower[members] = -np.inf
            upper[members] = ceiling if lost.any() else np.inf
    settled = ~(above | below)
    shown = np.where(above & ~below, lower, np.where(below & ~above, upper, point))
    centre = (point[settled] if settled.any() else shown).mean() - BASE_RATING
    return shown - centre, point - centre, lower - centre, upper - centre, above, below


def _weight_matrix(outcomes: PairOutcomes, weights: np.ndarray | None) -> np.ndarray:
    matrix = np.ones((outcomes.n_models, outcomes.n_models))
    if weights is not None:
        matrix[outcomes.first, outcomes.second] = matrix[outcomes.second, outcomes.first] = weights
    return matrix


_CLUSTER_CHUNK = 20_000  # Voters per block of the meat's dense scores: 20,000 x models floats.


def _cluster_meat(voter: np.ndarray, first: np.ndarray, second: np.ndarray, residual: np.ndarray, n: int) -> np.ndarray:
    """sum over voters of s_v s_v^T, s_v the voter's score (``residual`` on ``first``, minus it on
    ``second``), times G / (G - 1) for G voters (``cluster_meat``)."""
    return cluster_meat(voter, np.column_stack([first, second]), np.column_stack([residual, -residual]), n)


def cluster_meat(
    voter: np.ndarray, columns: np.ndarray, values: np.ndarray, dims: int, dense: np.ndarray | None = None
) -> np.ndarray:
    """sum over voters of s_v s_v^T times G / (G - 1) for G voters, where s_v sums over the
    voter's rows r the ``values[r]`` placed at ``columns[r]`` (of ``dims``), followed by the sum
    of their ``dense[r]`` (rows x k: the covariates' part of a score, if any). The scores are
    built densely a block of voters at a time (bincounts, then one product per block): several
    times faster than a sparse matrix on a million rows, in bounded memory. Rows need only be
    grouped by block (a counting sort of the block numbers when they are not; rows sorted by
    voter, as the tally keeps them, already are)."""
    extra = 0 if dense is None else dense.shape[1]
    if voter.size == 0:
        return np.zeros((dims + extra, dims + extra))
    present = np.zeros(int(voter.max(initial=0)) + 1, dtype=bool)
    present[voter] = True
    code = (np.cumsum(present) - 1)[voter]  # Dense codes 0..G-1.
    clusters = int(present.sum())
    chunk = max(min(_CLUSTER_CHUNK, clusters), 1)
    block = code // chunk
    blocks = int(block[-1] if block.size else 0) + 1
    if block.size > 1 and np.any(block[1:] < block[:-1]):
        blocks = int(block.max()) + 1
        narrow = block.astype(np.uint16) if blocks < 2**16 else block
        order = np.argsort(narrow, kind="stable")  # Radix sort on 16 bits: linear.
        code, block, columns, values = code[order], block[order], columns[order], values[order]
        dense = None if dense is None else dense[order]
    meat = np.zeros((dims + extra, dims + extra))
    bounds = np.searchsorted(block, np.arange(blocks + 1))
    with threadpool_limits(limits=1, user_api="blas"):
        for number, (low, high) in enumerate(itertools.pairwise(bounds)):
            if low == high:
                continue
            local = code[low:high] - number * chunk
            at = (local * dims)[:, None] + columns[low:high]
            scores = np.bincount(at.ravel(), values[low:high].ravel(), chunk * dims).reshape(chunk, dims)
            if dense is not None:
                sums = [np.bincount(local, column, chunk) for column in dense[low:high].T]
                scores = np.column_stack([scores, *sums])
            meat += scores.T @ scores
    return meat * (clusters / max(clusters - 1, 1))


def _laplacian(n: int, i: np.ndarray, j: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """sum_c weight_c (e_i - e_j)(e_i - e_j)^T; bincount, many times faster than np.add.at."""
    off = np.bincount(i * n + j, weight, minlength=n * n).reshape(n, n)
    off += off.T
    return np.diag(off.sum(axis=1)) - off


def _z(level: float) -> float:
    if level == 0.95:
        return Z_95
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2.0)


def _checked_weights(outcomes: PairOutcomes, pair_weights: np.ndarray | None) -> np.ndarray | None:
    """Inverse-probability weights per pair (1 / the pair's sampling probability), scaled so
    that the weighted votes add up to the real number of votes."""
    if pair_weights is None:
        return None
    weights = np.asarray(pair_weights, dtype=float)
    if weights.shape != outcomes.first.shape or np.any(weights <= 0):
        raise ValueError("pair_weights needs one positive weight per pair.")
    games = outcomes.first_wins + outcomes.second_wins + outcomes.ties
    weighted = float((weights * games).sum())
    return weights * (games.sum() / weighted) if weighted > 0 else weights


def inverse_probability_weights(outcomes: PairOutcomes, pair_probabilities: np.ndarray) -> np.ndarray:
    """Weights for ``pair_weights`` from each pair's probability of being drawn for a battle."""
    probabilities = np.asarray(pair_probabilities, dtype=float)
    if probabilities.shape != outcomes.first.shape or np.any(probabilities <= 0):
        raise ValueError("Every pair needs a positive sampling probability.")
    return 1.0 / probabilities


RANK_RESOLUTION = 0.1  # Rating points: the board's precision; bounds closer than this do not rank.


def ranks_from_intervals(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Rank = 1 + the number of models whose lower bound is above this model's upper bound (by
    more than the board's precision, ``RANK_RESOLUTION``: two intervals of no width a millionth
    of a point apart, as a fit whose covariate separates a tiny group gives, do not rank):
    models whose intervals overlap share a rank."""
    return 1 + (lower[None, :] > upper[:, None] + RANK_RESOLUTION).sum(axis=1)


def win_fraction_matrix(outcomes: PairOutcomes) -> np.ndarray:
    """fraction[i, j] = share of i's votes against j that i won (ties half); NaN if never met."""
    wins = outcomes.wins()
    games = outcomes.games()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(games > 0, wins / np.where(games > 0, games, 1.0), np.nan)


def expected_score(rating_a: float, rating_b: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / ELO_SCALE))


def online_elo(
    n_models: int,
    games: Sequence[tuple[int, int, float]],
    *,
    k: float = 32.0,
    initial: float = BASE_RATING,
    start: np.ndarray | None = None,
) -> np.ndarray:
    """Elo updated game by game in the order given (oldest first), from ``start`` (the ratings
    after earlier games) or from ``initial`` for everyone."""
    ratings = np.full(n_models, initial, dtype=float) if start is None else np.array(start, dtype=float)
    for a, b, score_a in games:
        expected_a = expected_score(ratings[a], ratings[b])
        ratings[a] += k * (score_a - expected_a)
        ratings[b] -= k * (score_a - expected_a)
    return ratings


def wilson_interval(successes: float, trials: float, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion; (0, 1) when there are no trials."""
    if trials <= 0:
        return 0.0, 1.0
    z = _z(level)
    share = successes / trials
    denominator = 1.0 + z * z / trials
    centre = (share + z * z / (2.0 * trials)) / denominator
    half = z * np.sqrt(share * (1.0 - share) / trials + z * z / (4.0 * trials * trials)) / denominator
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


@dataclass(frozen=True)
class FixRate:
    fixed: int
    corrections: int
    rate: float | None
    lower: float
    upper: float


def fix_rate(fixed: int, corrections: int) -> FixRate:
    """The share of replies to a correction that fixed the mistake (🥦), with its Wilson interval."""
    lower, upper = wilson_interval(fixed, corrections)
    return FixRate(fixed, corrections, fixed / corrections if corrections else None, lower, upper)
