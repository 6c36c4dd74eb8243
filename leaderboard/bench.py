"""Benchmark of the leaderboard refresh on synthetic votes (``manage.py bench_leaderboard``).

Stages, each timed (wall clock) on every repeat of the whole refresh and run once more for its
peak traced memory (tracemalloc, which numpy reports to): reduction of the votes to pairwise
counts and to counts per (voter, pair, outcome), the Bradley-Terry fits, the intervals clustered
by voter with the comparison groups and open ends (``ratings.rate_board``, as the site's refresh
rates its vote boards), rank fragility (leaderboard.fragility), the matrices, style control (the
votes reduced to cells with their style differences, then the contextual fit with its intervals
clustered by voter), fix-ability on synthetic episodes (one for every ten votes) and anomaly
detection. As in the site's refresh (leaderboard.services), BLAS keeps to one thread throughout.
With ``busy`` processes, the whole refresh is timed again while that many processes spin on the
machine's cores (leaderboard.busy). Online Elo is
maintained as votes arrive in a live arena, so a refresh does not pay for it; replaying it from
scratch is timed on its own line.

The reference is the arena method of late 2023: an unpenalised logistic regression on the whole
expanded vote table, refitted on every bootstrap round. It runs a few rounds and is
extrapolated to the requested number, labelled as such. Style-controlled bootstrap intervals
are compared per round with FastChat's ``compute_bootstrap_style_control`` (``style_reference``).
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from leaderboard import anomaly, busy, fixing, fragility, ratings, style


def synthetic_votes(votes: int, models: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model a, model b, score of a) arrays from known strengths, ~10% ties."""
    rng = np.random.default_rng(seed)
    strengths = rng.normal(1000, 120, models)
    a = rng.integers(0, models, votes)
    b = (a + rng.integers(1, models, votes)) % models
    p_a = 1.0 / (1.0 + 10.0 ** ((strengths[b] - strengths[a]) / 400.0))
    tie = rng.random(votes) < 0.1
    score = np.where(tie, 0.5, (rng.random(votes) < p_a).astype(float))
    return a, b, score


def synthetic_style(a: np.ndarray, b: np.ndarray, seed: int = 0) -> np.ndarray:
    """Style differences per vote (leaderboard.style): reply lengths of 50-800 tokens, 0-5
    headers, list items and bold spans per side."""
    rng = np.random.default_rng(seed + 1)
    sides = [
        np.column_stack([rng.integers(50, 800, a.size), rng.integers(0, 6, (a.size, 3))]).astype(float) for _ in "ab"
    ]
    return style.differences(sides[0], sides[1])


def synthetic_episodes(count: int, models: int, seed: int = 0) -> list[fixing.Episode]:
    """Fix episodes over ``models`` models and 30 task turns, two to a battle, each correction of
    one of the three kinds, one in five a second attempt, the battles' voters drawn from 20,000."""
    rng = np.random.default_rng(seed + 2)
    ability, difficulty = rng.normal(0, 1, models), rng.normal(0, 1, 30)
    model, cell = rng.integers(0, models, count), rng.integers(0, 30, count)
    kind, attempt = rng.integers(0, len(fixing.KINDS), count), 1 + (rng.random(count) < 0.2)
    voter = rng.integers(0, 20_000, (count + 1) // 2)
    fixed = rng.random(count) < 1.0 / (1.0 + np.exp(-(ability[model] + difficulty[cell] + 0.5 * kind)))
    rows = zip(model.tolist(), cell.tolist(), fixed.tolist(), kind.tolist(), attempt.tolist(), strict=True)
    return [
        fixing.Episode(
            f"m{m}", f"t{c // 6}", int(c % 6), bool(f), f"b{i // 2}", fixing.KINDS[k], int(n), f"v{voter[i // 2]}"
        )
        for i, (m, c, f, k, n) in enumerate(rows)
    ]


def reduce_to_outcomes(models: int, a: np.ndarray, b: np.ndarray, score: np.ndarray) -> ratings.PairOutcomes:
    """What the database's GROUP BY does, for arrays: counts per (pair, outcome) cell."""
    return reduce_to_boards(models, a, b, score, np.zeros(a.size, dtype=np.int64), [np.array([True])])[0]


def reduce_to_boards(
    models: int, a: np.ndarray, b: np.ndarray, score: np.ndarray, group: np.ndarray, boards: list[np.ndarray]
) -> list[ratings.PairOutcomes]:
    """Every board's counts per (pair, outcome) cell in one pass over the votes: one count per
    (group, pair, outcome), then each board sums its groups (``boards``: one flag per group)."""
    first, second = np.minimum(a, b), np.maximum(a, b)
    score_first = np.where(a < b, score, 1.0 - score)
    outcome = np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2))
    groups = int(group.max()) + 1 if group.size else 1
    cell = ((group * models + first) * models + second) * 3 + outcome
    counts = np.bincount(cell, minlength=groups * models * models * 3).reshape(groups, models, models, 3)
    i, j = np.triu_indices(models, k=1)
    reduced = []
    for board in boards:
        cells = counts[np.asarray(board)[:groups]].sum(axis=0)[i, j].astype(float)
        present = cells.sum(axis=1) > 0
        kept = cells[present]
        reduced.append(ratings.PairOutcomes(models, i[present], j[present], kept[:, 0], kept[:, 1], kept[:, 2]))
    return reduced


BOARD_VOTERS = 200_000  # Voters of the synthetic votes, by whom the boards' intervals are clustered.


def synthetic_board_voters(votes: int, seed: int = 0) -> np.ndarray:
    """A voter per vote among ``BOARD_VOTERS``, unevenly active (lognormal activity: a few
    voters cast dozens of votes, most one to five)."""
    rng = np.random.default_rng(seed + 6)
    activity = rng.lognormal(0.0, 1.0, BOARD_VOTERS)
    return rng.choice(BOARD_VOTERS, votes, p=activity / activity.sum())


def reduce_to_voter_boards(
    models: int,
    a: np.ndarray,
    b: np.ndarray,
    score: np.ndarray,
    group: np.ndarray,
    voter: np.ndarray,
    boards: list[np.ndarray],
) -> list[ratings.VoterCells]:
    """Every board's votes by voter: each board takes its groups' rows, as the refresh takes
    each board's from its running counts (``leaderboard.tally``: sorted by voter, as the votes
    given here should be). Repeated (voter, pair, outcome) rows need not be merged: a voter's
    rows add up in the meat."""
    first, second = np.minimum(a, b), np.maximum(a, b)
    score_first = np.where(a < b, score, 1.0 - score)
    outcome = np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2))
    reduced = []
    for board in boards:
        keep = np.asarray(board)[group]
        rows = int(keep.sum())
        reduced.append(ratings.VoterCells(models, voter[keep], first[keep], second[keep], outcome[keep], np.ones(rows)))
    return reduced


class _Stages:
    """The refresh's stages, timed (wall clock) on every repeat of the whole refresh, their peak
    traced memory measured once (tracemalloc, which numpy reports to; tracing slows numpy's
    allocations, so no timed run is traced)."""

    def __init__(self, *, trace: bool = True) -> None:
        self.seconds: dict[str, list[float]] = {}
        self.peak_mib: dict[str, float] = {}
        self.trace = trace  # Whether to measure each stage's peak memory (once).

    def run(self, name: str, work: Callable[[], Any]) -> Any:
        # Every run from cold: the normal draws the boards share are drawn again, as a refresh
        # in a fresh worker would draw them.
        ratings._standard_normals.cache_clear()
        began = time.perf_counter()
        value = work()
        self.seconds.setdefault(name, []).append(time.perf_counter() - began)
        if self.trace and name not in self.peak_mib:
            ratings._standard_normals.cache_clear()
            tracemalloc.start()
            work()
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            self.peak_mib[name] = peak / 2**20
        return value

    def table(self) -> list[dict[str, Any]]:
        """Per stage: the median of its repeats (the figure quoted), the fastest and the slowest."""
        return [
            {
                "stage": name,
                "seconds": float(np.median(runs)),
                "fastest_seconds": min(runs),
                "slowest_seconds": max(runs),
                "peak_mib": self.peak_mib.get(name),
            }
            for name, runs in self.seconds.items()
        ]

    def totals(self) -> list[float]:
        """The whole refresh's seconds on each repeat: the sum of its stages on that repeat."""
        return [float(sum(repeat)) for repeat in zip(*self.seconds.values(), strict=True)]


def reference_round_seconds(
    a: np.ndarray, b: np.ndarray, score: np.ndarray, models: int, rounds: int, seed: int
) -> float:
    """Seconds per bootstrap round of the reference: resample the votes, expand them into a
    design matrix, fit an unpenalised logistic regression."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    began = time.perf_counter()
    for _ in range(rounds):
        pick = rng.integers(0, a.size, a.size)
        sa, sb, ss = a[pick], b[pick], score[pick]
        rows = np.arange(sa.size)
        design = np.zeros((sa.size, models), dtype=np.float32)
        design[rows, sa] = 1.0
        design[rows, sb] = -1.0
        # A tie is a half-weight win for each side, as in the arena's method.
        tie = ss == 0.5
        x = np.concatenate([design, design[tie]])
        y = np.concatenate([(ss >= 0.5).astype(int), np.zeros(int(tie.sum()), dtype=int)])
        weights = np.concatenate([np.where(tie, 0.5, 1.0), np.full(int(tie.sum()), 0.5)])
        LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-6, max_iter=100).fit(x, y, sample_weight=weights)
    return (time.perf_counter() - began) / rounds


CATEGORIES = 7  # Overall, preference after correction and five task categories, as the site's boards.
TASKS = 5
VOTERS, STUFFERS = 20_000, 25


def synthetic_categories(votes: int, seed: int = 0) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Which votes each vote board counts, as a group per vote (its task, 0 for free chat, and
    whether it came after a correction) and per board the groups it sums: every vote overall,
    one in seven after a correction, and the votes of each of five tasks (a sixth of them are
    free chat, in no task board)."""
    rng = np.random.default_rng(seed + 3)
    task = rng.integers(0, TASKS + 1, votes)  # 0: free chat.
    after = rng.random(votes) < 1 / 7
    group = task * 2 + after
    groups = np.arange(2 * (TASKS + 1))
    boards = [("overall", np.ones(groups.size, dtype=bool)), ("after correction", groups % 2 == 1)]
    return group, boards + [(f"task {t}", groups // 2 == t) for t in range(1, TASKS + 1)]


def synthetic_voters(a: np.ndarray, b: np.ndarray, score: np.ndarray, seed: int = 0) -> anomaly.VoteTable:
    """The votes as the anomaly detection reads them, reduced to (voter, pair, outcome) counts:
    20,000 voters; half the battles of model 0 go to 25 stuffers, who vote for it every time."""
    rng = np.random.default_rng(seed + 4)
    voter = rng.integers(STUFFERS, VOTERS, a.size)
    stuffing = ((a == 0) | (b == 0)) & (rng.random(a.size) < 0.5)
    voter[stuffing] = rng.integers(0, STUFFERS, int(stuffing.sum()))
    score = np.where(stuffing, (a == 0).astype(float), score)
    first, second = np.minimum(a, b), np.maximum(a, b)
    outcome = np.where(a < b, score, 1.0 - score)
    models = int(max(a.max(), b.max())) + 1
    key = ((voter * models + first) * models + second) * 3 + (outcome * 2).astype(np.int64)
    cells, counts = np.unique(key, return_counts=True)
    code, pair = cells % 3, cells // 3
    return anomaly.VoteTable(
        [f"v{i}" for i in range(VOTERS)],
        [f"m{i}" for i in range(models)],
        pair // (models * models),
        (pair // models) % models,
        pair % models,
        code / 2.0,
        counts.astype(float),
    )


def run_bench(
    *,
    votes: int = 1_000_000,
    models: int = 40,
    rounds: int = 1000,
    reference_rounds: int = 2,
    seed: int = 0,
    repeats: int = 5,
    busy_processes: int = 0,
) -> dict[str, Any]:
    """The whole refresh ``repeats`` times in this process, each repeat from the same inputs and
    from cold (``_Stages.run``). A single timing on a shared 2-core machine
    varies by a factor of two from run to run; the median of the repeats is the figure quoted,
    the slowest repeat is reported beside it. With ``busy_processes``, the repeats are run again
    while that many processes spin (``busy.busy_cores``: started before, ended after), and
    reported under ``busy``."""
    load_average = os.getloadavg()
    a, b, score = synthetic_votes(votes, models, seed)  # Inputs: not timed.
    group, boards = synthetic_categories(votes, seed)
    differences = synthetic_style(a, b, seed)
    # As the refresh reads them: counted (the running counts keep the episodes as arrays).
    episodes = fixing.EpisodeCounts.from_episodes(synthetic_episodes(max(votes // 10, 1), models, seed))
    table = synthetic_voters(a, b, score, seed)
    voter = synthetic_board_voters(votes, seed)
    # The votes by voter, sorted by voter as the refresh's running counts keep them (untimed: the
    # refresh reads them so, as it reads the cells); style control's too.
    by_voter = np.argsort(voter)
    sorted_votes = (a[by_voter], b[by_voter], score[by_voter], group[by_voter], voter[by_voter])
    style_voters = style.StyleVoters(
        models,
        voter[by_voter],
        a[by_voter],
        b[by_voter],
        score[by_voter],
        style.rounded_steps(differences[by_voter]) * style.BINS,
        np.ones(votes),
    )

    def refresh(stages: _Stages) -> list[anomaly.Anomaly]:
        with threadpool_limits(limits=1, user_api="blas"):  # As the site's refresh.
            return _refresh(stages)

    def _refresh(stages: _Stages) -> list[anomaly.Anomaly]:
        outcomes = stages.run(
            f"reduce votes to pair counts, one pass ({len(boards)} vote boards)",
            lambda: reduce_to_boards(models, a, b, score, group, [groups for _, groups in boards]),
        )
        per_voter = stages.run(
            f"votes by voter, per board ({BOARD_VOTERS:,} voters)",
            lambda: reduce_to_voter_boards(models, *sorted_votes, [groups for _, groups in boards]),
        )
        fitted = stages.run("Bradley-Terry fits", lambda: [ratings.bradley_terry(o.wins()) for o in outcomes])
        stages.run(
            f"intervals clustered by voter, groups and open ends ({len(boards)} boards)",
            lambda: [ratings.rate_board(o, ci="clustered", voters=v) for o, v in zip(outcomes, per_voter, strict=True)],
        )
        orders = [[int(i) for i in np.argsort(-f, kind="stable")] for f in fitted]
        stages.run(
            f"rank fragility ({len(boards)} boards)",
            lambda: [fragility.swap_votes(o, order) for o, order in zip(outcomes, orders, strict=True)],
        )
        stages.run(
            "win-fraction and count matrices", lambda: [(ratings.win_fraction_matrix(o), o.games()) for o in outcomes]
        )
        styled = stages.run(
            "style control: votes to cells", lambda: style.StyleOutcomes.from_arrays(models, a, b, score, differences)
        )
        stages.run(
            f"style control: fit and intervals clustered by voter ({styled.first.size:,} cells)",
            lambda: style.style_controlled(styled, voters=style_voters),
        )
        stages.run(f"fix-ability ({round(episodes.count.sum()):,} episodes)", lambda: fixing.rate_fixes(episodes))
        return stages.run(
            f"anomaly detection ({len(table.voters):,} voters, {table.voter.size:,} rows)",
            lambda: anomaly.suspicious_voters(table, false_alarms=anomaly.FALSE_ALARMS),
        )

    stages = _Stages()
    flagged = [refresh(stages) for _ in range(repeats)][-1]
    totals = stages.totals()
    total = float(np.median(totals))
    busy_result = None
    if busy_processes > 0:
        loaded = _Stages(trace=False)
        with busy.busy_cores(busy_processes) as spinners:
            for _ in range(repeats):
                refresh(loaded)
        busy_totals = loaded.totals()
        busy_result = {
            "processes": busy_processes,
            "stages": loaded.table(),
            "seconds_total": float(np.median(busy_totals)),
            "seconds_total_each_repeat": busy_totals,
            "spinner_cpu_seconds": spinners.cpu_seconds,
        }
    # The boards' bootstrap intervals (votes taken as independent; rate_battles' default on dumps
    # that name no voter), timed beside the refresh for comparison, the median of ``repeats``.
    outcomes = reduce_to_boards(models, a, b, score, group, [groups for _, groups in boards])
    bootstrap_runs = []
    for _ in range(repeats):
        ratings._standard_normals.cache_clear()
        began = time.perf_counter()
        for board in outcomes:
            ratings.bootstrap_intervals(board, rounds=rounds, seed=seed)
        bootstrap_runs.append(time.perf_counter() - began)
    games = list(zip(a.tolist(), b.tolist(), score.tolist(), strict=True))
    elo_began = time.perf_counter()
    ratings.online_elo(models, games)
    elo_replay = time.perf_counter() - elo_began
    reference = None
    if reference_rounds > 0:
        try:
            per_round = reference_round_seconds(a, b, score, models, reference_rounds, seed)
        except ImportError:
            per_round = None
        if per_round is not None:
            reference = {
                "rounds_run": reference_rounds,
                "seconds_per_round": per_round,
                "seconds_extrapolated": per_round * rounds,
            }
    return {
        "votes": votes,
        "models": models,
        "rounds": rounds,
        "boards": len(boards),
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "load_average": list(load_average),
        "stages": stages.table(),
        "seconds_total": total,
        "seconds_total_each_repeat": totals,
        "busy": busy_result,
        "elo_replay_seconds": elo_replay,
        "bootstrap_comparison_seconds": float(np.median(bootstrap_runs)),
        "stuffers_flagged": sum(int(found.voter[1:]) < STUFFERS for found in flagged),
        "honest_flagged": sum(int(found.voter[1:]) >= STUFFERS for found in flagged),
        "reference": reference,
        "speedup_vs_reference": reference["seconds_extrapolated"] / total if reference else None,
        "style_reference": (
            style_reference(a, b, score, differences, models, seed, rounds=rounds, reference_rounds=reference_rounds)
            if reference_rounds > 0
            else None
        ),
    }


def fastchat_style_round_seconds(
    a: np.ndarray,
    b: np.ndarray,
    score: np.ndarray,
    differences: np.ndarray,
    models: int,
    rounds: int,
    seed: int,
    *,
    gradient_by_rows: bool = True,
) -> float:
    """Seconds per round of FastChat's ``compute_bootstrap_style_control`` (fastchat/serve/monitor/
    rating_systems.py), re-implemented operation by operation in one process: every round
    resamples the battles with replacement and fits the contextual Bradley-Terry by L-BFGS-B
    (100 iterations at most, gtol 1e-6) on the whole resampled table, features standardised,
    ridge 0.5, the matchups' gradient gathered by ``np.add.at`` over the [battles, 2] index
    array as FastChat does (``gradient_by_rows``). With ``gradient_by_rows=False`` it is gathered
    by two one-dimensional ``np.add.at`` calls instead (several times cheaper): FastChat's
    method with its slowest step removed, the stricter baseline."""
    from scipy.optimize import minimize
    from scipy.special import expit

    rng = np.random.default_rng(seed + 5)
    features = (differences - differences.mean(axis=0)) / differences.std(axis=0)
    matchups = np.column_stack([a, b])
    n, alpha, reg = models, np.log(10.0), 0.5
    sign = np.array([1.0, -1.0])

    def loss_and_gradient(
        params: np.ndarray, pairs: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        strengths = params[:n][pairs]
        p = expit(alpha * (strengths[:, 0] - strengths[:, 1]) + x @ params[n:])
        loss = -(np.log(p) * y + np.log(1.0 - p) * (1.0 - y)).sum() + reg / 2.0 * params @ params
        error = y - p
        gradient = reg * params
        if gradient_by_rows:
            np.add.at(gradient[:n], pairs, (-alpha * error)[:, None] * sign)
        else:
            np.add.at(gradient, pairs[:, 0], -alpha * error)
            np.add.at(gradient, pairs[:, 1], alpha * error)
        gradient[n:] -= x.T @ error
        return loss, gradient

    began = time.perf_counter()
    for _ in range(rounds):
        pick = rng.integers(0, a.size, a.size)
        minimize(
            loss_and_gradient,
            np.zeros(n + features.shape[1]),
            args=(matchups[pick], features[pick], score[pick]),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 100, "gtol": 1e-6},
        )
    return (time.perf_counter() - began) / rounds


def style_reference(
    a: np.ndarray,
    b: np.ndarray,
    score: np.ndarray,
    differences: np.ndarray,
    models: int,
    seed: int,
    battles: int = 200_000,
    rounds: int = 1000,
    reference_rounds: int = 2,
) -> dict[str, Any]:
    """Style-controlled bootstrap intervals, per round, on ``battles`` of the votes as the issue
    measured it: FastChat's method (``fastchat_style_round_seconds``, as FastChat computes it and
    with its gradient gathered the cheap way) against this arena's ``style.bootstrap_intervals``
    on the same battles' cells: the whole call, the full-data fit included, divided by its
    ``rounds``. All in one thread, BLAS's included: FastChat spreads its rounds over processes,
    this arena's over threads; each would gain alike from more cores."""
    a, b, score, differences = a[:battles], b[:battles], score[:battles], differences[:battles]
    with threadpool_limits(limits=1, user_api="blas"):  # This arena's rounds do the same.
        reference = fastchat_style_round_seconds(a, b, score, differences, models, reference_rounds, seed)
        cheaper = fastchat_style_round_seconds(
            a, b, score, differences, models, reference_rounds, seed, gradient_by_rows=False
        )
    cells = style.StyleOutcomes.from_arrays(models, a, b, score, differences)
    began = time.perf_counter()
    style.bootstrap_intervals(cells, rounds=rounds, seed=seed, threads=1)
    ours = (time.perf_counter() - began) / rounds
    return {
        "battles": int(a.size),
        "reference_rounds_run": reference_rounds,
        "rounds_run": rounds,
        "reference_seconds_per_round": reference,
        "cheaper_reference_seconds_per_round": cheaper,
        "seconds_per_round": ours,
        "speedup_per_round": reference / ours,
        "speedup_per_round_vs_cheaper": cheaper / ours,
    }


def format_table(result: dict[str, Any]) -> str:
    loaded = result["busy"]
    load = " ".join(f"{value:.2f}" for value in result["load_average"])
    lines = [
        f"{result['votes']:,} synthetic votes, {result['models']} models, {result['boards']} vote boards, "
        f"{result['rounds']} bootstrap rounds; the whole refresh run {result['repeats']} times"
        + (f", then {result['repeats']} more with {loaded['processes']} busy processes" if loaded else ""),
        f"{result['cpus']} CPUs, load average {load} at the start; BLAS kept to one thread",
        f"{'stage':<60} {'median s':>9} {'slowest':>9} {'peak MiB':>9}" + (f" {'busy s':>9}" if loaded else ""),
    ]
    busy_seconds = {s["stage"]: s["seconds"] for s in loaded["stages"]} if loaded else {}
    lines += [
        f"{s['stage']:<60} {s['seconds']:>9.3f} {s['slowest_seconds']:>9.3f} {s['peak_mib']:>9.1f}"
        + (f" {busy_seconds[s['stage']]:>9.3f}" if loaded else "")
        for s in result["stages"]
    ]
    each = result["seconds_total_each_repeat"]
    lines.append(f"{'whole refresh':<60} {result['seconds_total']:>9.3f} {max(each):>9.3f}")
    lines.append(f"{'  each repeat':<60} " + " ".join(f"{seconds:.3f}" for seconds in each))
    if loaded:
        busy_each = loaded["seconds_total_each_repeat"]
        spun = ", ".join("?" if cpu is None else f"{cpu:.1f}" for cpu in loaded["spinner_cpu_seconds"])
        lines.append(
            f"{'whole refresh, ' + str(loaded['processes']) + ' busy processes':<60} "
            f"{loaded['seconds_total']:>9.3f} {max(busy_each):>9.3f}"
        )
        lines.append(f"{'  each repeat':<60} " + " ".join(f"{seconds:.3f}" for seconds in busy_each))
        lines.append(f"{'  CPU seconds each spinner used':<60} {spun}")
    lines.append(f"{'(online Elo replayed from scratch)':<60} {result['elo_replay_seconds']:>9.3f}")
    instead = f"(bootstrap intervals instead, {result['rounds']} rounds x {result['boards']} boards)"
    lines.append(f"{instead:<60} {result['bootstrap_comparison_seconds']:>9.3f}")
    lines.append(
        f"anomaly detection: {result['stuffers_flagged']} of 25 stuffers flagged, {result['honest_flagged']} honest"
    )
    reference = result["reference"]
    if reference:
        lines.append(
            f"reference (logistic regression per round): {reference['seconds_per_round']:.2f} s/round over "
            f"{reference['rounds_run']} rounds, extrapolated to {result['rounds']}: "
            f"{reference['seconds_extrapolated']:.0f} s -> speedup {result['speedup_vs_reference']:.0f}x"
        )
    else:
        lines.append("reference: not run (scikit-learn missing or --reference-rounds 0)")
    styled = result["style_reference"]
    if styled:
        lines.append(
            f"style-controlled bootstrap, per round on {styled['battles']:,} battles, one thread: FastChat's "
            f"method {styled['reference_seconds_per_round']:.3f} s, with its gradient gathered by 1-D add.at "
            f"{styled['cheaper_reference_seconds_per_round']:.3f} s ({styled['reference_rounds_run']} rounds each); "
            f"this arena's {styled['seconds_per_round'] * 1000:.2f} ms ({styled['rounds_run']} rounds) "
            f"-> {styled['speedup_per_round']:.0f}x and {styled['speedup_per_round_vs_cheaper']:.0f}x"
        )
    return "\n".join(lines)
