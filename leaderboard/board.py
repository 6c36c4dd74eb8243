"""A leaderboard from votes: ratings with intervals, ranks, Elo, counts. No Django.

Shared by the site's refresh and by ``manage.py rate_battles`` (public arena dumps).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np

from leaderboard import fragility, ratings, style

CI_METHODS = ("bootstrap", "sandwich")
# The site's boards: the voter-clustered sandwich (``ratings.clustered_intervals``), which needs
# the votes per voter; public dumps name no voter and take one of ``CI_METHODS``.
CLUSTERED = "clustered"
# The public arena's clean_battle "winner" values, as the score of model_a.
WINNER_SCORES = {"model_a": 1.0, "model_b": 0.0, "tie": 0.5, "tie (bothbad)": 0.5}


@dataclass(frozen=True)
class BoardRow:
    """A model's row. ``lower`` / ``upper`` are None on an open side (``lower_open`` /
    ``upper_open``: the votes put no bound there), and ``rating`` is then the finite bound, the
    figure the votes support; ``bound_note`` says why in words. ``group``: the comparison group
    (1: the largest); ``rank`` counts within it."""

    model: str
    rating: float
    lower: float | None
    upper: float | None
    rank: int
    votes: int
    elo: float | None
    group: int = 1
    lower_open: bool = False
    upper_open: bool = False
    bound_note: str = ""
    # Votes whose removal would swap this model with the next one down (leaderboard.fragility);
    # None for the last row, for the last of its comparison group, and on boards that do not
    # compute it (style control).
    swap_votes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def interval_text(row: Mapping[str, Any]) -> str:
    """A row's 95% interval in words: "lower – upper"; an open side as "≥ 1210, unbeaten" or
    "≤ 850, never won"; with too little evidence for any width (a bootstrap whose rounds all
    agree), "too few to tell"."""
    lower, upper = row.get("lower"), row.get("upper")
    note = row.get("bound_note") or ""
    if row.get("upper_open") and row.get("lower_open"):
        return f"no bound either way, {note}" if note else "no bound either way"
    if row.get("upper_open"):
        return f"≥ {lower:.0f}, {note}" if note else f"≥ {lower:.0f}"
    if row.get("lower_open"):
        return f"≤ {upper:.0f}, {note}" if note else f"≤ {upper:.0f}"
    if upper - lower < 0.05:
        return "too few to tell"
    return f"{lower:.1f} – {upper:.1f}"


def compute_board(
    names: Sequence[str],
    outcomes: ratings.PairOutcomes,
    *,
    elo: np.ndarray | None = None,
    ci: str = "bootstrap",
    voters: ratings.VoterCells | None = None,
    rounds: int = 1000,
    seed: int = 0,
    prior: float | None = None,
    pair_weights: np.ndarray | None = None,
) -> list[BoardRow]:
    """Rows, each with its interval: one per model with a vote, by comparison group (models
    that never met, directly or through others, are not ranked against each other), then by
    rating; ties in rank share the number (``ratings.rate_board``). A model without a vote is
    not rated at all (``unrated``). ``pair_weights`` (one per pair of ``outcomes``):
    inverse-probability weights for pairs sampled unevenly. ``ci`` "clustered": intervals
    clustered by voter, from ``voters`` (the votes per voter, in ``names``' numbering)."""
    if ci not in (*CI_METHODS, CLUSTERED):
        raise ValueError(f"ci must be one of {', '.join((*CI_METHODS, CLUSTERED))}, got {ci!r}.")
    if outcomes.n_models != len(names):
        raise ValueError("One name per model is needed.")
    played = outcomes.played()
    rated = [name for name, flag in zip(names, played, strict=True) if flag]
    # Every pair with a vote is between played models: restricting keeps the pairs and their order.
    outcomes = outcomes.restricted(played)
    fitted = ratings.rate_board(
        outcomes,
        ci=ci,
        voters=None if voters is None else voters.restricted(played),
        rounds=rounds,
        seed=seed,
        prior=prior,
        pair_weights=pair_weights,
    )
    elo_values = np.asarray(elo)[played] if elo is not None else np.full(len(rated), ratings.BASE_RATING)
    rows = _ranked_rows(rated, fitted, outcomes.games().sum(axis=1), elo_values, outcomes)
    order = [rated.index(row.model) for row in rows]
    swaps = fragility.swap_votes(outcomes, order, prior=prior, pair_weights=pair_weights)
    # Models of comparison groups that never met are not ordered: no number of votes swaps them.
    following = [row.group for row in rows[1:]] + [None] if rows else []
    return [
        replace(row, swap_votes=swap if group == row.group else None)
        for row, swap, group in zip(rows, swaps, following, strict=True)
    ]


class _Fitted(Protocol):
    ratings: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    ranks: np.ndarray


def _bound(value: float) -> float | None:
    return round(float(value), 1) if np.isfinite(value) else None


def _bound_notes(fitted: ratings.BoardFit, outcomes: ratings.PairOutcomes) -> list[str]:
    """Why a model's interval is open, in words."""
    wins = outcomes.wins()
    scored, conceded = (wins > 0).sum(axis=1), (wins > 0).sum(axis=0)
    notes = []
    for i in range(outcomes.n_models):
        if fitted.upper_open[i] and fitted.lower_open[i]:
            notes.append("never compared in either direction with the settled models")
        elif fitted.upper_open[i]:
            notes.append("unbeaten" if conceded[i] == 0 else "never beaten by the settled models")
        elif fitted.lower_open[i]:
            notes.append("never won" if scored[i] == 0 else "never beat the settled models")
        else:
            notes.append("")
    return notes


def _ranked_rows(
    rated: Sequence[str],
    fitted: _Fitted,
    votes: np.ndarray,
    elo: np.ndarray | None = None,
    outcomes: ratings.PairOutcomes | None = None,
) -> list[BoardRow]:
    """One row per rated model, best first (ties in rating by name), from a fit's ratings,
    intervals and ranks (``ratings.BoardFit``, ``ratings.RatingsWithIntervals`` or
    ``style.StyleControlled``): by comparison group, then by the fitted rating."""
    if isinstance(fitted, ratings.BoardFit) and outcomes is not None:
        group, point = fitted.group, fitted.fitted
        upper_open, lower_open = fitted.upper_open, fitted.lower_open
        notes = _bound_notes(fitted, outcomes)
    else:
        group, point = np.zeros(len(rated), dtype=np.intp), fitted.ratings
        upper_open = lower_open = np.zeros(len(rated), dtype=bool)
        notes = [""] * len(rated)
    order = sorted(range(len(rated)), key=lambda i: (group[i], -point[i], rated[i]))
    return [
        BoardRow(
            model=rated[i],
            rating=round(float(fitted.ratings[i]), 1),
            lower=_bound(fitted.lower[i]),
            upper=_bound(fitted.upper[i]),
            rank=int(fitted.ranks[i]),
            votes=round(float(votes[i])),
            elo=None if elo is None else round(float(elo[i]), 1),
            group=int(group[i]) + 1,
            lower_open=bool(lower_open[i]),
            upper_open=bool(upper_open[i]),
            bound_note=notes[i],
        )
        for i in order
    ]


def compute_style_board(
    names: Sequence[str],
    outcomes: style.StyleOutcomes,
    *,
    ci: str = "sandwich",
    rounds: int = 1000,
    seed: int = 0,
    voters: style.StyleVoters | None = None,
) -> tuple[list[BoardRow], dict[str, Any]]:
    """The board with style control (leaderboard.style): rows of the models with a vote, ranked
    by their rating at equal style (no Elo), and each style coefficient with its interval
    (log-odds per unit of normalised difference). Sandwich intervals by default (one fit: what
    the site's refresh shows; clustered by voter with ``voters``), or bootstrap ones from
    ``rounds`` resamplings."""
    if ci not in CI_METHODS:
        raise ValueError(f"ci must be one of {', '.join(CI_METHODS)}, got {ci!r}.")
    played = outcomes.played()
    rated = [name for name, flag in zip(names, played, strict=True) if flag]
    if not rated:
        return [], {}
    restricted = outcomes.restricted(played)
    voters = None if voters is None else voters.restricted(played)

    def fit(cells: style.StyleOutcomes, rows: style.StyleVoters | None) -> style.StyleControlled:
        if ci == "bootstrap":
            return style.bootstrap_intervals(cells, rounds=rounds, seed=seed)
        return style.style_controlled(cells, voters=rows)

    fitted = fit(restricted, voters)
    counts = np.zeros(len(rated))
    games = restricted.first_wins + restricted.second_wins + restricted.ties
    np.add.at(counts, restricted.first, games)
    np.add.at(counts, restricted.second, games)
    # Comparison groups and open ends as on the plain board (``ratings.rate_board``): each group
    # fitted on its own (the coefficients are the whole board's), open sides from the pairs.
    pairs = _pair_outcomes(restricted)
    group = ratings.comparison_groups(pairs)
    n = len(rated)
    board = {name: np.zeros(n) for name in ("ratings", "lower", "upper", "fitted")}
    ranks, upper_open, lower_open = np.ones(n, dtype=np.intp), np.zeros(n, bool), np.zeros(n, bool)
    for label in range(int(group.max(initial=-1)) + 1):
        keep = group == label
        part = fitted if keep.all() else fit(restricted.restricted(keep), voters and voters.restricted(keep))
        shown, point, lower, upper, above, below = ratings.settle_open_ends(
            pairs.restricted(keep), None, part.ratings, part.lower, part.upper
        )
        board["ratings"][keep], board["lower"][keep], board["upper"][keep] = shown, lower, upper
        board["fitted"][keep] = point
        ranks[keep] = ratings.ranks_from_intervals(lower, upper)
        upper_open[keep], lower_open[keep] = above, below
    settled = ratings.BoardFit(
        board["ratings"], board["lower"], board["upper"], ranks, group, upper_open, lower_open, board["fitted"], ci
    )
    rows = _ranked_rows(rated, settled, counts, None, pairs)
    coefficients = {
        feature: {
            "value": round(float(fitted.coefficients[k]), 4),
            "lower": round(float(fitted.coefficient_lower[k]), 4),
            "upper": round(float(fitted.coefficient_upper[k]), 4),
        }
        for k, feature in enumerate(style.FEATURES)
    }
    return rows, coefficients


def _pair_outcomes(outcomes: style.StyleOutcomes) -> ratings.PairOutcomes:
    """The style cells summed per pair."""
    n = outcomes.n_models
    code = outcomes.first * n + outcomes.second
    cells = np.stack(
        [np.bincount(code, column, n * n) for column in (outcomes.first_wins, outcomes.second_wins, outcomes.ties)],
        axis=1,
    )
    pairs = np.flatnonzero(cells.sum(axis=1))
    kept = cells[pairs]
    return ratings.PairOutcomes(n, pairs // n, pairs % n, kept[:, 0], kept[:, 1], kept[:, 2])


def unrated(names: Sequence[str], outcomes: ratings.PairOutcomes) -> list[str]:
    """The models without a vote: "not yet rated", never ranked."""
    return [name for name, flag in zip(names, outcomes.played(), strict=True) if not flag]


class BattleFileError(ValueError):
    """A battles file that can't be read; the message names the record and the problem."""


def read_records(text: str, noun: str = "battles") -> list[Any]:
    """Records from a JSON list, or from JSON Lines (one object per line); ``noun`` names them
    in the refusal of an empty file."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except ValueError as error:
            raise BattleFileError(f"Not valid JSON: {error}.") from None
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as error:
                raise BattleFileError(f"Line {number} is not valid JSON: {error}.") from None
    if not records:
        raise BattleFileError(f"No {noun} in the file.")
    return records


def read_battles(text: str) -> list[dict[str, Any]]:
    """Battle records from a JSON list or JSON Lines."""
    return read_records(text, "battles")


def style_votes_from_battles(records: Sequence[Any], names: Sequence[str]) -> list[tuple[int, int, float, np.ndarray]]:
    """(a, b, score of a, style differences) per battle, from the ``conv_metadata`` of LMArena's
    releases (and of this arena's dumps); ``names`` from ``games_from_battles``."""
    index_of = {name: i for i, name in enumerate(names)}
    votes = []
    for number, record in enumerate(records, start=1):
        try:
            difference = style.differences_from_metadata(record.get("conv_metadata"))
        except ValueError as error:
            raise BattleFileError(f"Battle {number}: {error}; --style-control needs it.") from None
        score = WINNER_SCORES[record["winner"]]
        votes.append((index_of[record["model_a"]], index_of[record["model_b"]], score, difference))
    return votes


def voters_from_battles(records: Sequence[Any], names: Sequence[str]) -> ratings.VoterCells | None:
    """The battles' votes per voter, the voter being the record's ``judge`` (this arena's dumps
    and LMArena's releases name one: a stable pseudonym); None when a record names none."""
    judges = [record.get("judge") for record in records]
    if not judges or not all(isinstance(judge, str) and judge for judge in judges):
        return None
    index_of = {name: i for i, name in enumerate(names)}
    code = {judge: i for i, judge in enumerate(dict.fromkeys(judges))}
    return ratings.VoterCells.from_votes(
        len(names),
        (
            (code[judge], index_of[record["model_a"]], index_of[record["model_b"]], WINNER_SCORES[record["winner"]])
            for judge, record in zip(judges, records, strict=True)
        ),
    )


def games_from_battles(records: Iterable[Any]) -> tuple[list[str], list[tuple[int, int, float]]]:
    """Model names and (a, b, score of a) games, in time order when records have ``tstamp``."""
    parsed = []
    for index, record in enumerate(records):
        where = f"Battle {index + 1}"
        if not isinstance(record, dict):
            raise BattleFileError(f"{where} is not an object.")
        a, b, winner = record.get("model_a"), record.get("model_b"), record.get("winner")
        if not isinstance(a, str) or not isinstance(b, str) or not a or not b:
            raise BattleFileError(f"{where} needs model_a and model_b names.")
        if a == b:
            raise BattleFileError(f"{where} pits {a} against itself.")
        if winner not in WINNER_SCORES:
            raise BattleFileError(f"{where} has winner {winner!r}; expected one of {', '.join(WINNER_SCORES)}.")
        stamp = record.get("tstamp", index)
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise BattleFileError(f"{where} has a tstamp that is not a number.")
        parsed.append((stamp, index, a, b, WINNER_SCORES[winner]))
    parsed.sort()  # By time, then file order: Elo depends on it.
    names = sorted({name for _, _, a, b, _ in parsed for name in (a, b)})
    index_of = {name: i for i, name in enumerate(names)}
    return names, [(index_of[a], index_of[b], score) for _, _, a, b, score in parsed]
