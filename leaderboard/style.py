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
style); intervals are sandwich (Huber-White) intervals from the cells in closed form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

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
        cls, n_models: int, a: np.ndarray, b: np.ndarray, score: np.ndarray, difference: np.ndarray
    ) -> StyleOutcomes:
        """The same from arrays (a, b, score of a: [votes]; differences: [votes, features]), in
        one vectorised pass: each cell's key packs the pair and the rounded differences into one
        integer."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        if np.any(a == b):
            raise ValueError("A model cannot play itself.")
        flip = a > b
        first, second = np.where(flip, b, a), np.where(flip, a, b)
        score_first = np.where(flip, 1.0 - np.asarray(score, dtype=float), score)
        levels = round(1.0 / BINS)
        difference = np.asarray(difference, dtype=float)
        difference = difference.reshape(a.size, -1) if a.size else np.zeros((0, len(FEATURES)))
        steps = np.rint(difference / BINS).astype(np.int64)
        steps = np.clip(np.where(flip[:, None], -steps, steps), -levels, levels) + levels
        key = first * n_models + second
        for column in steps.T:  # Base 2 * levels + 1 digits, after the pair.
            key = key * (2 * levels + 1) + column
        cells, inverse = np.unique(key, return_inverse=True)
        outcome = np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2))
        counts = np.zeros((cells.size, 3))
        np.add.at(counts, (inverse, outcome), 1.0)
        digits = np.zeros((cells.size, steps.shape[1]), dtype=np.int64)
        rest = cells.copy()
        for column in range(steps.shape[1] - 1, -1, -1):
            rest, digits[:, column] = np.divmod(rest, 2 * levels + 1)
        return cls(
            n_models,
            (rest // n_models).astype(np.intp),
            (rest % n_models).astype(np.intp),
            (digits - levels).astype(float) * BINS,
            counts[:, 0],
            counts[:, 1],
            counts[:, 2],
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
class StyleControlled:
    ratings: np.ndarray  # Elo scale, mean 1000: the ratings at equal style.
    lower: np.ndarray
    upper: np.ndarray
    ranks: np.ndarray
    coefficients: np.ndarray  # Log-odds per unit of each normalised difference.
    coefficient_lower: np.ndarray
    coefficient_upper: np.ndarray


def _with_prior(outcomes: StyleOutcomes, prior: float) -> tuple[np.ndarray, ...]:
    """The cells plus ``prior`` virtual ties per pair at equal style."""
    n = outcomes.n_models
    i, j = np.triu_indices(n, 1)
    k = outcomes.features.shape[1]
    return (
        np.concatenate([outcomes.first, i]),
        np.concatenate([outcomes.second, j]),
        np.concatenate([outcomes.features, np.zeros((i.size, k))]),
        np.concatenate([outcomes.first_wins, np.zeros(i.size)]),
        np.concatenate([outcomes.second_wins, np.zeros(i.size)]),
        np.concatenate([outcomes.ties, np.full(i.size, prior)]),
    )


def _blocks(n: int, first: np.ndarray, second: np.ndarray, features: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """sum_c weight_c g_c g_c^T for the cells' rows g_c = [e_i - e_j, features_c], block by block
    (the strengths' block is a weighted Laplacian): O(cells x features^2), never a dense design
    matrix of the cells."""
    k = features.shape[1]
    matrix = np.zeros((n + k, n + k))
    matrix[:n, :n] = ratings._laplacian(n, first, second, weight)
    weighted = features * weight[:, None]
    cross = np.column_stack(
        [np.bincount(first, column, minlength=n) - np.bincount(second, column, minlength=n) for column in weighted.T]
    ).reshape(n, k)
    matrix[:n, n:], matrix[n:, :n] = cross, cross.T
    matrix[n:, n:] = weighted.T @ features
    return matrix


def _gradient(n: int, first: np.ndarray, second: np.ndarray, features: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """sum_c residual_c g_c."""
    strengths = np.bincount(first, residual, minlength=n) - np.bincount(second, residual, minlength=n)
    return np.concatenate([strengths, features.T @ residual])


def style_controlled(outcomes: StyleOutcomes, *, prior: float | None = None, level: float = 0.95) -> StyleControlled:
    """The contextual Bradley-Terry fit with sandwich intervals (see the module docstring)."""
    n, k = outcomes.n_models, outcomes.features.shape[1]
    prior = ratings.default_prior(n) if prior is None else prior
    first, second, features, wins_i, wins_j, ties = _with_prior(outcomes, prior)
    games = wins_i + wins_j + ties
    scored = wins_i + ties / 2.0
    params = np.zeros(n + k)
    # The strengths' common shift is free: fixing their mean makes the system regular. A feature
    # no reply has (no markdown at all) has no information: a negligible ridge keeps it at 0.
    gauge = np.zeros((n + k, n + k))
    gauge[:n, :n] = 1.0 / n
    gauge[n:, n:] = 1e-9 * np.eye(k)

    def probabilities() -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(params[first] - params[second] + features @ params[n:])))

    for _ in range(100):
        p = probabilities()
        gradient = _gradient(n, first, second, features, scored - games * p)
        step = np.linalg.solve(_blocks(n, first, second, features, games * p * (1.0 - p)) + gauge, gradient)
        step = np.clip(step, -5.0, 5.0)
        params += step
        params[:n] -= params[:n].mean()
        if np.max(np.abs(step)) < 1e-10:
            break
    # Sandwich: the meat sums each vote's squared score, from the cell's outcome counts; the
    # prior's virtual ties (the last cells) are not data.
    p = probabilities()
    squared = wins_i * (1.0 - p) ** 2 + wins_j * p**2 + ties * (0.5 - p) ** 2
    real = np.arange(first.size) < outcomes.first.size
    meat = _blocks(n, first[real], second[real], features[real], squared[real])
    inverse = np.linalg.pinv(_blocks(n, first, second, features, games * p * (1.0 - p)))
    covariance = inverse @ meat @ inverse
    spread = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    z = ratings._z(level)
    to_rating = ratings.ELO_SCALE / np.log(10.0)
    fitted = ratings.BASE_RATING + to_rating * params[:n]
    lower, upper = fitted - z * to_rating * spread[:n], fitted + z * to_rating * spread[:n]
    return StyleControlled(
        ratings=fitted,
        lower=lower,
        upper=upper,
        ranks=ratings.ranks_from_intervals(lower, upper),
        coefficients=params[n:],
        coefficient_lower=params[n:] - z * spread[n:],
        coefficient_upper=params[n:] + z * spread[n:],
    )


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
