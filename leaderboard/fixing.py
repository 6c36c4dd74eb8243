"""Fix-ability: how well each model fixes a mistake once told, from fix episodes. No Django.

A fix episode is one reply judged wrong, the correction sent to that side, and the reply to it:
fixed or not. Raw fix rates reward a model whose corrections happened to be easy (a wrong year
is easier to fix than a wrong weekday computed from a date), so the rating is a logistic
regression of "fixed" on a model effect plus a difficulty effect per task turn:

    logit P(fixed) = ability[model] + difficulty[task, turn]

fitted by Newton's method on the counts per (model, task turn), with a weak ridge (``RIDGE``:
a normal prior of standard deviation about 3 on the log-odds) that keeps a model that fixed
everything, or nothing, finite. The abilities are reported as contrasts with their mean, on the
Elo scale of the other boards (1000 + 400·log10 of the odds ratio to the average model: 400
points above is ten times the odds of fixing the same correction). Their intervals are sandwich
(Huber-White) intervals clustered by battle: the episodes of one battle share a voter and a
conversation, so they are not independent. Beside the rating: the raw fix rate with its Wilson
interval, and the number of episodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from leaderboard.ratings import BASE_RATING, ELO_SCALE, _z, ranks_from_intervals, wilson_interval
from votes.checkers import is_fact

RIDGE = 0.1  # Penalty on every coefficient: a prior N(0, 1/0.1) on the log-odds.
_TO_RATING = ELO_SCALE / np.log(10.0)


@dataclass(frozen=True)
class Episode:
    """One correction of one model's wrong reply, and whether the reply to it fixed it."""

    model: str
    task: str
    turn: int
    fixed: bool
    battle: str | None = None  # Episodes of one battle form a cluster; None: its own.


Parts = Mapping[str, bool]  # A checker's judgement part by part (votes.checkers.CheckResult.parts).


def regressed(wrong: Parts, answer: Parts) -> bool | None:
    """Whether the answer to a correction broke a part the wrong reply had right, judged field
    by field by the checker (the date fixed, the time now wrong). None when the checker judged
    no part of one of the two replies (no call at all): nothing to compare."""
    if not wrong or not answer:
        return None
    return any(right and answer.get(part) is False for part, right in wrong.items())


def fixed_parts(wrong: Parts, answer: Parts) -> frozenset[str]:
    """The parts the correction fixed: wrong before, right in the answer."""
    return frozenset(part for part, right in wrong.items() if not right and answer.get(part) is True)


def persisted(fixed: frozenset[str], later: Iterable[Parts]) -> bool | None:
    """Whether the facts a correction fixed stay right in that side's later checked replies:
    the parts named by an expected value (``checkers.is_fact``: the year 2024, fixed at the
    calendar's turn 2), judged by each later reply that expects the same value (turns 3 to 6,
    whose dates differ but whose year is 2024). A later reply that expects something else (the
    next day's date) says nothing about it. None when no later reply expects any of them."""
    facts = [part for part in fixed if is_fact(part)]
    verdicts = [parts[fact] for parts in later for fact in facts if fact in parts]
    return all(verdicts) if verdicts else None


def turns_to_fix(fixed_by_attempt: Sequence[bool]) -> int | None:
    """How many corrections one mistake took: the attempt that fixed it, None if none did."""
    return next((attempt for attempt, fixed in enumerate(fixed_by_attempt, 1) if fixed), None)


@dataclass(frozen=True)
class FixAbility:
    model: str
    rating: float  # Elo scale, the models' mean at 1000.
    lower: float
    upper: float
    rank: int  # 1 + the models whose interval lies wholly above this one's.
    fix_rate: float  # Raw share of episodes fixed...
    fix_lower: float  # ...and its Wilson interval.
    fix_upper: float
    episodes: int
    fixed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fit(
    model_index: np.ndarray, cell_index: np.ndarray, trials: np.ndarray, successes: np.ndarray, n_params: int
) -> tuple[np.ndarray, np.ndarray]:
    """Penalised logistic regression on aggregated cells, each the sum of two coefficients
    (``model_index`` and ``cell_index`` into one parameter vector); returns the coefficients and
    the Hessian of the penalised negative log-likelihood at them."""
    theta = np.zeros(n_params)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(theta[model_index] + theta[cell_index])))
        residual = successes - trials * p
        gradient = -RIDGE * theta
        np.add.at(gradient, model_index, residual)
        np.add.at(gradient, cell_index, residual)
        weight = trials * p * (1.0 - p)
        hessian = RIDGE * np.eye(n_params)
        np.add.at(hessian, (model_index, model_index), weight)
        np.add.at(hessian, (cell_index, cell_index), weight)
        np.add.at(hessian, (model_index, cell_index), weight)
        np.add.at(hessian, (cell_index, model_index), weight)
        step = np.linalg.solve(hessian, gradient)
        theta += step
        if np.max(np.abs(step)) < 1e-10:
            break
    return theta, hessian


@dataclass(frozen=True)
class EpisodeCounts:
    """Episodes as arrays, counted where they share everything: per row its model (a code into
    ``models``), its difficulty cell (into ``cells``: task and turn), whether it was fixed, how
    many episodes it counts, and its cluster: rows of one battle share a code; -1: each of the
    row's episodes is a cluster of its own (a battle with one episode, or no battle)."""

    models: list[str]
    cells: list[tuple[str, int]]
    model: np.ndarray
    cell: np.ndarray
    fixed: np.ndarray
    count: np.ndarray
    cluster: np.ndarray

    @classmethod
    def from_episodes(cls, episodes: Iterable[Episode]) -> EpisodeCounts:
        episodes = list(episodes)
        models = sorted({e.model for e in episodes})
        cells = sorted({(e.task, e.turn) for e in episodes})
        model_of = {name: i for i, name in enumerate(models)}
        cell_of = {cell: i for i, cell in enumerate(cells)}
        clusters: dict[Any, int] = {}
        return cls(
            models,
            cells,
            np.array([model_of[e.model] for e in episodes], dtype=np.intp),
            np.array([cell_of[(e.task, e.turn)] for e in episodes], dtype=np.intp),
            np.array([e.fixed for e in episodes], dtype=float),
            np.ones(len(episodes)),
            np.array(
                [-1 if e.battle is None else clusters.setdefault(e.battle, len(clusters)) for e in episodes],
                dtype=np.intp,
            ),
        )


def rate_fixes(episodes: Iterable[Episode] | EpisodeCounts, *, level: float = 0.95) -> list[FixAbility]:
    """One row per model with an episode, best first (see the module docstring)."""
    table = episodes if isinstance(episodes, EpisodeCounts) else EpisodeCounts.from_episodes(episodes)
    if not table.count.sum():
        return []
    models = table.models
    n_models = len(models)
    n_params = n_models + len(table.cells)
    rows, columns, fixed, count = table.model, n_models + table.cell, table.fixed, table.count

    # The fit needs only the counts per (model, task turn).
    keys, inverse = np.unique(rows * n_params + columns, return_inverse=True)
    trials = np.bincount(inverse, weights=count)
    successes = np.bincount(inverse, weights=count * fixed)
    theta, hessian = _fit(keys // n_params, keys % n_params, trials, successes, n_params)

    # Sandwich covariance, clustered by battle: the meat sums each cluster's score first. A row
    # of c episodes that are each their own cluster adds c times its score's outer product, as
    # one cluster of score sqrt(c) times it would.
    p = 1.0 / (1.0 + np.exp(-(theta[rows] + theta[columns])))
    alone = table.cluster < 0
    shared = int(table.cluster.max(initial=-1)) + 1
    cluster = np.where(alone, shared + np.cumsum(alone) - 1, table.cluster)
    residual = (fixed - p) * np.where(alone, np.sqrt(count), count)
    n_clusters = shared + int(alone.sum())
    scores = np.bincount(
        np.concatenate([cluster * n_params + rows, cluster * n_params + columns]),
        np.concatenate([residual, residual]),
        minlength=n_clusters * n_params,
    ).reshape(n_clusters, n_params)
    bread = np.linalg.inv(hessian)
    covariance = bread @ (scores.T @ scores) @ bread
    # Contrasts with the models' mean: the only thing the data identifies about the abilities.
    contrast = np.zeros((n_models, n_params))
    contrast[:, :n_models] = np.eye(n_models) - 1.0 / n_models
    ability = contrast @ theta
    spread = np.sqrt(np.maximum(np.diag(contrast @ covariance @ contrast.T), 0.0))
    half = _z(level) * spread
    rating = BASE_RATING + _TO_RATING * ability
    lower, upper = rating - _TO_RATING * half, rating + _TO_RATING * half
    ranks = ranks_from_intervals(lower, upper)
    counts = np.bincount(rows, weights=count, minlength=n_models)
    fixes = np.bincount(rows, weights=count * fixed, minlength=n_models)
    results = []
    for i, name in enumerate(models):
        wilson = wilson_interval(fixes[i], counts[i], level)
        results.append(
            FixAbility(
                model=name,
                rating=round(float(rating[i]), 1),
                lower=round(float(lower[i]), 1),
                upper=round(float(upper[i]), 1),
                rank=int(ranks[i]),
                fix_rate=round(float(fixes[i] / counts[i]), 4),
                fix_lower=round(wilson[0], 4),
                fix_upper=round(wilson[1], 4),
                episodes=int(counts[i]),
                fixed=int(fixes[i]),
            )
        )
    return sorted(results, key=lambda row: (-row.rating, row.model))


def episodes_from_records(records: Sequence[Any]) -> list[Episode]:
    """Episodes from JSON records (``rate_fixes`` files): ``model``, ``task``, ``turn`` and
    ``fixed`` are required, ``battle`` optional; a ``decoy`` record (a false correction) is not a
    fix episode, and an ``excluded`` one (the site's dumps hold those too) is not counted: both
    are left out. Raises ValueError naming the record and the problem."""
    episodes = []
    for number, record in enumerate(records, start=1):
        where = f"Episode {number}"
        if not isinstance(record, dict):
            raise ValueError(f"{where} is not an object.")
        model, task, turn, fixed = (record.get(key) for key in ("model", "task", "turn", "fixed"))
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where} needs a model name.")
        if not isinstance(task, str) or not task:
            raise ValueError(f"{where} needs a task name.")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
            raise ValueError(f"{where} needs turn, a whole number of at least 0.")
        if not isinstance(fixed, bool):
            raise ValueError(f"{where} needs fixed, true or false.")
        battle = record.get("battle")
        if battle is not None and not isinstance(battle, (str, int)):
            raise ValueError(f"{where} has a battle that is neither a string nor a number.")
        if record.get("decoy", False) is True or record.get("excluded", False) is True:
            continue
        episodes.append(Episode(model, task, turn, fixed, None if battle is None else str(battle)))
    return episodes
