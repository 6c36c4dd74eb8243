"""Fix-ability: how well each model fixes a mistake once told, from fix episodes. No Django.

A fix episode is one reply judged wrong, the correction sent to that side, and the reply to it:
fixed or not. Raw fix rates reward a model whose corrections happened to be easy (a wrong year
is easier to fix than a wrong weekday computed from a date), that were told the answer
("prescriptive") rather than only that they were wrong ("generic"), or that were on a first
attempt rather than a third, so the rating is a logistic regression of "fixed" on

    logit P(fixed) = ability[model] + difficulty[prompt] + kind[correction's kind] + attempt[1, 2, 3+]

- ``difficulty`` in a task is one coefficient per scripted turn: every battle of the task sends
  that turn's prompt. In free chat each battle's prompts are its own, so its difficulty is one
  coefficient per battle, a nuisance eliminated by conditioning on it: only the episodes of two
  different models in one battle, one fixed and one not, say anything about the two models
  (the probability that it is this one that fixed is ``sigmoid(difference of the rest)``,
  whatever the battle's difficulty). This pairwise conditional likelihood is consistent for
  any distribution of the prompts' difficulties, including one that depends on the models
  (below); a free-chat episode alone in its battle counts in the raw rate only.
- ``kind``: generic / points at the error / gives the right value (``votes.feedback``), the
  generic one the reference; ``attempt``: the first correction of a mistake the reference.

Selection: an episode exists only after a wrong reply, and a model that is rarely wrong is
wrong on harder prompts. Within a free-chat battle both sides answered the same prompt, so the
conditional comparison holds the prompt's difficulty fixed; in a task, the scripted turn does.
What stays is a difficulty that varies inside one task turn and drives both the first try and
the fix: its bias is measured in tests/test_fix_ability.py and stated in docs/statistics.md,
and the board shows each model's rate of wrong replies beside its fix-ability.

The difficulty, kind and attempt coefficients carry a weak ridge (``RIDGE``: a normal prior of
standard deviation about 3 on the log-odds), the abilities none (only their common level, which
the data do not identify, is pinned). A model that never fixed a correction (or fixed every
one), among the models it is compared with, has no finite maximum-likelihood ability: it is
left out of the fit, which is then exactly the fit of the others (its episodes carry no
information about them), and gets Firth's estimate (the Jeffreys-penalised likelihood: the
log-likelihood plus half the log-determinant of the Fisher information, no penalty weight to
choose) from its own rows, the rest of each row held at the fit, and a likelihood-ratio
interval open on the side the data cannot bound (``lower`` None: "no fix observed"; ``upper``
None: "no failure observed"). A model with no episode the regression can compare (free-chat
episodes alone in their battles) is shown unrated.

The abilities are reported as contrasts with the mean of the models with a finite estimate, on
the Elo scale of the other boards (1000 + 400·log10 of the odds ratio to the average model: 400
points above is ten times the odds of fixing the same correction). Their intervals are sandwich
(Huber-White) intervals clustered by voter (by battle where the voter is not known: a file of
episodes without one): a voter's episodes share their judgement and tastes, and one battle's a
conversation, so they are not independent (for the pairwise likelihood this is its Godambe
variance). Beside the rating: the raw fix rate with its Wilson interval, and the episodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from leaderboard.ratings import BASE_RATING, ELO_SCALE, _z, ranks_from_intervals, wilson_interval
from votes import feedback
from votes.checkers import is_fact

RIDGE = 0.1  # Penalty on the difficulty, kind and attempt coefficients: a prior N(0, 1/0.1).
ABILITY_RIDGE = 1e-6  # Numerical only: pins the abilities' common level, which the data leave free.
FREE_CHAT = "free chat"  # The task name of free-chat episodes: difficulty per battle, conditioned out.
KINDS = feedback.KINDS  # Kinds of correction; the first (generic) is the reference.
ATTEMPTS = 3  # Attempts 1, 2 and 3-or-later: the first the reference.
NO_FIX, NO_FAILURE, NO_COMPARISON = "no fix observed", "no failure observed", "no comparable episode"
_TO_RATING = ELO_SCALE / np.log(10.0)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))  # No overflow where a coefficient runs off (separation).


@dataclass(frozen=True)
class Episode:
    """One correction of one model's wrong reply, and whether the reply to it fixed it."""

    model: str
    task: str  # FREE_CHAT for free chat.
    turn: int
    fixed: bool
    battle: str | None = None  # Episodes of one battle form a cluster; None: its own.
    specificity: str = feedback.GENERIC  # The correction's kind (KINDS).
    attempt: int = 1  # 1 for the first correction of this mistake, 2 for the next, ...
    voter: str | None = None  # The intervals' cluster where known (else the battle).


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
    rating: float | None  # Elo scale, the mean of the models with a finite estimate at 1000; None: unrated.
    lower: float | None  # None: open-ended (``open_ended`` says why).
    upper: float | None
    rank: int | None  # 1 + the models whose interval lies wholly above this one's.
    fix_rate: float  # Raw share of episodes fixed...
    fix_lower: float  # ...and its Wilson interval.
    fix_upper: float
    episodes: int
    fixed: int
    open_ended: str = ""  # NO_FIX, NO_FAILURE or NO_COMPARISON; empty: an estimate with a closed interval.
    group: int = 1  # Comparison group (1: the largest); models of different groups share no prompt.

    def as_dict(self) -> dict[str, Any]:
        """The row, with the open ends flagged as the vote boards' rows flag them
        (``lower_open``, ``upper_open``, ``bound_note``), so that one display serves both."""
        rated = self.rating is not None
        return asdict(self) | {
            "lower_open": rated and self.lower is None,
            "upper_open": rated and self.upper is None,
            "bound_note": self.open_ended,
        }


@dataclass(frozen=True)
class EpisodeCounts:
    """Episodes as arrays, counted where they share everything: per row its model (a code into
    ``models``), its difficulty cell (into ``cells``: task and turn; FREE_CHAT cells are free
    chat), whether it was fixed, how many episodes it counts, its cluster (rows of one battle
    share a code; -1: each of the row's episodes is a cluster of its own, a battle with one
    episode or no battle), the correction's kind (a code into ``KINDS``; None: all generic), the
    attempt (None: all first) and the voter (a code; -1 or None: unknown), by whom the
    intervals are clustered where known."""

    models: list[str]
    cells: list[tuple[str, int]]
    model: np.ndarray
    cell: np.ndarray
    fixed: np.ndarray
    count: np.ndarray
    cluster: np.ndarray
    kind: np.ndarray | None = None
    attempt: np.ndarray | None = None
    voter: np.ndarray | None = None

    @classmethod
    def from_episodes(cls, episodes: Iterable[Episode]) -> EpisodeCounts:
        episodes = list(episodes)
        models = sorted({e.model for e in episodes})
        cells = sorted({(e.task, e.turn) for e in episodes})
        model_of = {name: i for i, name in enumerate(models)}
        cell_of = {cell: i for i, cell in enumerate(cells)}
        clusters: dict[Any, int] = {}
        voters: dict[str, int] = {}
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
            np.array([KINDS.index(e.specificity) for e in episodes], dtype=np.intp),
            np.array([e.attempt for e in episodes], dtype=np.intp),
            np.array([-1 if e.voter is None else voters.setdefault(e.voter, len(voters)) for e in episodes], np.intp),
        )


@dataclass(frozen=True)
class _Rows:
    """The regression's rows: each a design (up to ``cols.shape[1]`` coefficients ``coefs`` on
    parameters ``cols``), its trials, successes, cluster of the intervals (the voter where known,
    else the battle; -1: each trial its own), and the models
    it compares (``winner``: the model of a full row, or the fixed one of a pair; ``loser``: -1 for
    a full row, else the pair's unfixed one), and a code equal for rows of equal design."""

    cols: np.ndarray
    coefs: np.ndarray
    trials: np.ndarray
    successes: np.ndarray
    cluster: np.ndarray
    winner: np.ndarray
    loser: np.ndarray
    code: np.ndarray  # Equal for rows of equal design.

    def take(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, name)[keep] for name in self.__dataclass_fields__))


def _rows(table: EpisodeCounts) -> tuple[_Rows, int]:
    """Full rows (task episodes, one coefficient per task turn) and pair rows (two models'
    free-chat episodes in one battle, one fixed: the design of the fixed one minus the other's,
    a success), and the number of parameters: abilities, task turns, kinds but the first,
    attempts but the first."""
    n_models = len(table.models)
    free = np.array([task == FREE_CHAT for task, _ in table.cells], dtype=bool)
    cell_param = np.where(free, 0, n_models + np.cumsum(~free) - 1)
    first_kind = n_models + int((~free).sum())
    n_params = first_kind + len(KINDS) - 1 + ATTEMPTS - 1
    n = len(table.model)
    kind = np.zeros(n, dtype=np.intp) if table.kind is None else np.asarray(table.kind, dtype=np.intp)
    attempt = np.ones(n, dtype=np.intp) if table.attempt is None else np.minimum(table.attempt, ATTEMPTS)
    cols = np.stack(
        [
            table.model,
            cell_param[table.cell],
            np.where(kind > 0, first_kind + kind - 1, 0),
            np.where(attempt > 1, first_kind + len(KINDS) - 1 + attempt - 2, 0),
        ],
        axis=1,
    ).astype(np.intp)
    coefs = np.stack([np.ones(n), (~free[table.cell]).astype(float), kind > 0, attempt > 1], axis=1).astype(float)
    is_free = free[table.cell]
    full = np.flatnonzero(~is_free)

    # The intervals' clusters: the voter where known (a voter's episodes share their judgement and
    # tastes, across battles), else the battle (a pair's two episodes share both).
    voter = np.full(n, -1, np.intp) if table.voter is None else np.asarray(table.voter, dtype=np.intp)
    meat = np.where(voter >= 0, voter, np.where(table.cluster >= 0, int(voter.max(initial=-1)) + 1 + table.cluster, -1))

    # Pairs: every fixed free-chat row against every unfixed one of another model in its battle.
    pooled = np.flatnonzero(is_free & (table.cluster >= 0))
    order = pooled[np.argsort(table.cluster[pooled], kind="stable")]
    cluster = table.cluster[order]
    starts = np.flatnonzero(np.r_[True, cluster[1:] != cluster[:-1]]) if len(order) else np.zeros(0, np.intp)
    sizes = np.diff(np.r_[starts, len(order)])
    group = np.repeat(np.arange(len(starts)), sizes)
    reps = sizes[group]
    left = np.repeat(np.arange(len(order)), reps)
    right = starts[group[left]] + np.arange(len(left)) - np.repeat(np.cumsum(reps) - reps, reps)
    i, j = order[left], order[right]
    keep = (table.fixed[i] == 1) & (table.fixed[j] == 0) & (table.model[i] != table.model[j])
    i, j = i[keep], j[keep]
    pair_trials = table.count[i] * table.count[j]
    kinds, attempts = len(KINDS), ATTEMPTS
    design_type = ((table.model * len(table.cells) + table.cell) * kinds + kind) * attempts + attempt - 1
    types = n_models * len(table.cells) * kinds * attempts + 1
    width = cols.shape[1]
    rows = _Rows(
        cols=np.concatenate(
            [np.concatenate([cols[full], np.zeros_like(cols[full])], axis=1), np.concatenate([cols[i], cols[j]], 1)]
        ).reshape(-1, 2 * width),
        coefs=np.concatenate(
            [
                np.concatenate([coefs[full], np.zeros_like(coefs[full])], axis=1),
                np.concatenate([coefs[i], -coefs[j]], 1),
            ]
        ).reshape(-1, 2 * width),
        trials=np.concatenate([table.count[full], pair_trials]),
        successes=np.concatenate([table.count[full] * table.fixed[full], pair_trials]),
        cluster=np.concatenate([meat[full], meat[i]]).astype(np.intp),
        winner=np.concatenate([table.model[full], table.model[i]]).astype(np.intp),
        loser=np.concatenate([np.full(len(full), -1), table.model[j]]).astype(np.intp),
        code=np.concatenate([design_type[full] * types, design_type[i] * types + design_type[j] + 1]).astype(np.int64),
    )
    return rows, n_params


def _active_models(rows: _Rows, n_models: int) -> np.ndarray:
    """Which models have a finite maximum-likelihood ability: left out, one after another, those
    whose rows among the models kept show no fix, or no failure, or are none."""
    active = np.ones(n_models, dtype=bool)
    full = rows.loser < 0
    while True:
        use = active[rows.winner] & (full | active[np.maximum(rows.loser, 0)])
        wins = np.bincount(rows.winner[use], rows.successes[use], minlength=n_models)
        losses = np.bincount(rows.winner[use & full], (rows.trials - rows.successes)[use & full], minlength=n_models)
        losses = losses + np.bincount(rows.loser[use & ~full], rows.trials[use & ~full], minlength=n_models)
        out = active & ((wins == 0) | (losses == 0))
        if not out.any():
            return active
        active &= ~out


def _design_matrix(cols: np.ndarray, coefs: np.ndarray, n_params: int) -> np.ndarray:
    matrix = np.zeros((len(cols), n_params))
    np.add.at(matrix, (np.repeat(np.arange(len(cols)), cols.shape[1]), cols.ravel()), coefs.ravel())
    return matrix


def _fit(
    design: np.ndarray, trials: np.ndarray, successes: np.ndarray, penalty: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Penalised logistic regression (Newton's method) on aggregated rows; returns the
    coefficients and the Hessian of the penalised negative log-likelihood at them."""
    theta = np.zeros(design.shape[1])
    hessian = np.diag(penalty)
    for _ in range(100):
        p = _sigmoid(design @ theta)
        gradient = design.T @ (successes - trials * p) - penalty * theta
        hessian = design.T @ (design * (trials * p * (1.0 - p))[:, None]) + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        theta += step
        if np.max(np.abs(step)) < 1e-10:
            break
    return theta, hessian


def _firth(design: np.ndarray, offset: np.ndarray, trials: np.ndarray, successes: np.ndarray) -> np.ndarray:
    """Firth's penalised logistic regression (the maximum of the log-likelihood plus half the log
    of the determinant of the Fisher information: the Jeffreys prior), with offsets: finite
    where the data are separated, and with no penalty weight to choose. Fisher scoring on the
    modified score, each step halved until the penalised log-likelihood rises."""
    eye = ABILITY_RIDGE * np.eye(design.shape[1])

    def parts(beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        eta = design @ beta + offset
        p = _sigmoid(eta)
        weight = trials * p * (1.0 - p)
        information = design.T @ (design * weight[:, None]) + eye
        objective = float(np.sum(successes * eta - trials * np.logaddexp(0.0, eta)))
        objective += 0.5 * np.linalg.slogdet(information)[1] - 0.5 * ABILITY_RIDGE * float(beta @ beta)
        leverage = weight * np.einsum("ij,ji->i", design, np.linalg.solve(information, design.T))
        score = design.T @ (successes - trials * p + leverage * (0.5 - p)) - ABILITY_RIDGE * beta
        return objective, np.linalg.solve(information, score), information

    beta = np.zeros(design.shape[1])
    objective, step, _ = parts(beta)
    for _ in range(200):
        for _ in range(40):
            trial = beta + step
            trial_objective, trial_step, _ = parts(trial)
            if trial_objective >= objective - 1e-12:
                break
            step = step / 2.0
        converged = np.max(np.abs(trial - beta)) < 1e-9
        beta, objective, step = trial, trial_objective, trial_step
        if converged:
            break
    return beta


def _likelihood_interval(
    sign: np.ndarray, offset: np.ndarray, trials: np.ndarray, successes: np.ndarray, z: float
) -> tuple[float, float, str]:
    """One model's likelihood-ratio interval from its rows, the rest of each row's design held
    at its fit (``offset``), open (infinite) on the side where the log-likelihood rises without
    end, and why: no fix observed (it fixed none), no failure observed (it fixed all), or ""."""
    wins = float(successes[sign > 0].sum() + (trials - successes)[sign < 0].sum())
    losses = float((trials - successes)[sign > 0].sum() + successes[sign < 0].sum())

    def log_likelihood(ability: float) -> float:
        eta = sign * ability + offset
        return float(np.sum(successes * eta - trials * np.logaddexp(0.0, eta)))

    def crossing(inside: float, outside: float, floor: float) -> float:
        for _ in range(80):  # Bisection: the log-likelihood is concave.
            middle = (inside + outside) / 2.0
            inside, outside = (middle, outside) if log_likelihood(middle) > floor else (inside, middle)
        return (inside + outside) / 2.0

    if wins == 0:
        return -np.inf, crossing(-60.0, 60.0, -z * z / 2.0), NO_FIX
    if losses == 0:
        return crossing(60.0, -60.0, -z * z / 2.0), np.inf, NO_FAILURE
    low, high = -40.0, 40.0
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    for _ in range(100):  # Golden-section search for the maximum.
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (a, high) if log_likelihood(a) < log_likelihood(b) else (low, b)
    best = (low + high) / 2.0
    floor = log_likelihood(best) - z * z / 2.0
    return crossing(best, -60.0, floor), crossing(best, 60.0, floor), ""


def rate_fixes(episodes: Iterable[Episode] | EpisodeCounts, *, level: float = 0.95) -> list[FixAbility]:
    """One row per model with an episode, best first (see the module docstring)."""
    table = episodes if isinstance(episodes, EpisodeCounts) else EpisodeCounts.from_episodes(episodes)
    if not table.count.sum():
        return []
    with threadpool_limits(limits=1, user_api="blas"):  # It runs beside the refresh's other stages.
        return _rate(table, level)


def _rate(table: EpisodeCounts, level: float) -> list[FixAbility]:
    models = table.models
    n_models = len(models)
    rows, n_params = _rows(table)
    group = _comparison_groups(rows, n_models, n_params)
    active = _active_models(rows, n_models)
    used = active[rows.winner] & ((rows.loser < 0) | active[np.maximum(rows.loser, 0)])
    fitted = rows.take(used)

    # The fit needs only the counts per distinct design.
    keys, first, inverse = np.unique(fitted.code, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    design = _design_matrix(fitted.cols[first], fitted.coefs[first], n_params)
    trials = np.bincount(inverse, fitted.trials, minlength=len(keys))
    successes = np.bincount(inverse, fitted.successes, minlength=len(keys))
    penalty = np.full(n_params, RIDGE)
    penalty[:n_models] = np.where(active, ABILITY_RIDGE, 1.0)
    theta, hessian = _fit(design, trials, successes, penalty)

    # Sandwich covariance, clustered by voter (else battle): the meat sums each cluster's score first. A row
    # of c episodes that are each their own cluster adds c times its score's outer product, as
    # one cluster of score sqrt(c) times it would.
    eta = np.sum(theta[fitted.cols] * fitted.coefs, axis=1)
    p = _sigmoid(eta)
    alone = fitted.cluster < 0
    shared = int(fitted.cluster.max(initial=-1)) + 1
    cluster = np.where(alone, shared + np.cumsum(alone) - 1, fitted.cluster)
    residual = np.where(
        alone,
        (fitted.successes / np.maximum(fitted.trials, 1) - p) * np.sqrt(fitted.trials),
        fitted.successes - fitted.trials * p,
    )
    n_clusters = shared + int(alone.sum())
    scores = np.bincount(
        (cluster[:, None] * n_params + fitted.cols).ravel(),
        (fitted.coefs * residual[:, None]).ravel(),
        minlength=n_clusters * n_params,
    ).reshape(n_clusters, n_params)
    bread = np.linalg.inv(hessian)
    covariance = bread @ (scores.T @ scores) @ bread

    # Contrasts with the mean of the models with a finite estimate of the model's comparison group
    # (groups share no prompt: the data do not compare them, so each has a level of its own).
    same = group[:, None] == group[None, :]
    weight = same * active[None, :]
    contrast = np.zeros((n_models, n_params))
    contrast[:, :n_models] = np.eye(n_models) - weight / np.maximum(weight.sum(axis=1, keepdims=True), 1)
    ability = contrast @ theta
    spread = np.sqrt(np.maximum(np.diag(contrast @ covariance @ contrast.T), 0.0))
    z = _z(level)
    lower, upper = ability - z * spread, ability + z * spread
    notes = [""] * n_models
    # The models left out of the fit: Firth's estimate of their abilities from their rows (against
    # the models fitted, and one another), the rest of each row held at the fit, which they
    # therefore do not move; a likelihood-ratio interval each, open where the data give no bound.
    out = np.flatnonzero(~active)
    theirs = ~active[rows.winner] | ((rows.loser >= 0) & ~active[np.maximum(rows.loser, 0)])
    mine = rows.take(theirs)
    full_design = _design_matrix(mine.cols, mine.coefs, n_params)
    offset = full_design @ np.r_[theta[:n_models] * active, theta[n_models:]]
    seen = (full_design[:, out] != 0).any(axis=0)
    estimate = np.full(n_models, np.nan)
    if seen.any():
        estimate[out[seen]] = _firth(full_design[:, out[seen]], offset, mine.trials, mine.successes)
    for model in out:
        # The level of the model's comparison group: its fitted models' mean, else its estimates'.
        peers = group == group[model]
        fitted_peers, estimated_peers = peers & active, peers & ~active & ~np.isnan(estimate)
        center = (
            float(theta[:n_models][fitted_peers].mean())
            if fitted_peers.any()
            else float(estimate[estimated_peers].mean())
            if estimated_peers.any()
            else 0.0
        )
        ability[model] = estimate[model] - center
        if np.isnan(estimate[model]):
            notes[model] = NO_COMPARISON
            lower[model], upper[model] = -np.inf, np.inf
            continue
        own = full_design[:, model] != 0
        others = np.where(np.isin(np.arange(n_models), out) & (np.arange(n_models) != model), estimate, 0.0)
        others = np.where(np.isnan(others), 0.0, others)
        rest = offset[own] + full_design[np.ix_(own, np.arange(n_models))] @ others
        low, high, notes[model] = _likelihood_interval(
            full_design[own, model], rest, mine.trials[own], mine.successes[own], z
        )
        lower[model], upper[model] = low - center, high - center

    rated = ~np.isnan(ability)
    ranks = np.zeros(n_models, dtype=int)
    for label in np.unique(group):  # Ranked within the comparison group, on the rating scale.
        here = rated & (group == label)
        ranks[here] = ranks_from_intervals(_TO_RATING * lower[here], _TO_RATING * upper[here])
    counts = np.bincount(table.model, weights=table.count, minlength=n_models)
    fixes = np.bincount(table.model, weights=table.count * table.fixed, minlength=n_models)

    def on_scale(value: float) -> float | None:
        return round(float(BASE_RATING + _TO_RATING * value), 1) if np.isfinite(value) else None

    results = []
    for i, name in enumerate(models):
        wilson = wilson_interval(fixes[i], counts[i], level)
        results.append(
            FixAbility(
                model=name,
                rating=on_scale(ability[i]),
                lower=on_scale(lower[i]),
                upper=on_scale(upper[i]),
                rank=int(ranks[i]) if rated[i] else None,
                fix_rate=round(float(fixes[i] / counts[i]), 4),
                fix_lower=round(wilson[0], 4),
                fix_upper=round(wilson[1], 4),
                episodes=int(counts[i]),
                fixed=int(fixes[i]),
                open_ended=notes[i],
                group=int(group[i]) + 1,
            )
        )
    return sorted(results, key=lambda row: (row.rating is None, row.group, -(row.rating or 0.0), row.model))


def _comparison_groups(rows: _Rows, n_models: int, n_params: int) -> np.ndarray:
    """Per model, its comparison group (0: the largest, then by size and first model): models
    are compared where their episodes share a prompt (a task's scripted turn), or through a
    free-chat battle in which both were corrected; models that never share one, directly or
    through others, have no common level."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    # Nodes: the models, then the parameters (a task turn's difficulty links the models on it).
    cells = rows.cols[:, 1]
    on_cell = (rows.coefs[:, 1] != 0) & (rows.loser < 0)
    pairs = rows.loser >= 0
    start = np.concatenate([rows.winner[on_cell], rows.winner[pairs]])
    end = np.concatenate([n_models + cells[on_cell], rows.loser[pairs]])
    size = n_models + n_params
    graph = coo_matrix((np.ones(len(start)), (start, end)), shape=(size, size))
    _, labels = connected_components(graph, directed=False)
    # A model with nothing to compare (unrated) joins no group of its own: it is listed with the first.
    linked = (np.asarray(graph.sum(axis=0)).ravel() + np.asarray(graph.sum(axis=1)).ravel())[:n_models] > 0
    labels = labels[:n_models]
    group = np.zeros(n_models, dtype=np.intp)
    if linked.any():
        unique, first, counts = np.unique(labels[linked], return_index=True, return_counts=True)
        order = np.lexsort((first, -counts))  # Largest first, then by first model.
        rank = np.empty(len(unique), dtype=np.intp)
        rank[order] = np.arange(len(unique))
        group[linked] = rank[np.searchsorted(unique, labels[linked])]
    return group


def episodes_from_records(records: Sequence[Any]) -> list[Episode]:
    """Episodes from JSON records (``rate_fixes`` files, and the research export's episodes):
    ``model`` and ``fixed`` are required; ``task`` (missing, null or "free chat": free chat) with
    ``turn`` (required for a task), ``battle``, the correction's kind (``feedback_kind`` as the
    export names it, or ``specificity``: generic, pointing or prescriptive; generic when
    missing) and ``attempt`` (1 when missing) are optional; a ``decoy`` record (a false
    correction) is not a fix episode, and an ``excluded`` one (the site's dumps hold those too)
    is not counted: both are left out. Raises ValueError naming the record and the problem."""
    episodes = []
    for number, record in enumerate(records, start=1):
        where = f"Episode {number}"
        if not isinstance(record, dict):
            raise ValueError(f"{where} is not an object.")
        model, task, fixed = (record.get(key) for key in ("model", "task", "fixed"))
        task = FREE_CHAT if task is None else task
        turn = record.get("turn", 0 if task == FREE_CHAT else None)
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where} needs a model name.")
        if not isinstance(task, str) or not task:
            raise ValueError(f"{where} needs a task name (none for free chat).")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
            raise ValueError(f"{where} needs turn, a whole number of at least 0.")
        if not isinstance(fixed, bool):
            raise ValueError(f"{where} needs fixed, true or false.")
        battle = record.get("battle")
        if battle is not None and not isinstance(battle, (str, int)):
            raise ValueError(f"{where} has a battle that is neither a string nor a number.")
        kind = record.get("feedback_kind", record.get("specificity")) or feedback.GENERIC
        if kind not in KINDS:
            raise ValueError(f"{where} has a correction kind that is none of {', '.join(KINDS)}.")
        attempt = record.get("attempt", 1)
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise ValueError(f"{where} needs attempt, a whole number of at least 1.")
        if record.get("decoy", False) is True or record.get("excluded", False) is True:
            continue
        episodes.append(Episode(model, task, turn, fixed, None if battle is None else str(battle), kind, attempt))
    return episodes
