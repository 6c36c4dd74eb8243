"""Reads for the leaderboard: votes reduced to per-category pairwise counts, fix rates, snapshots."""

from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Count,
    Exists,
    F,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Abs, Floor, Sign
from django.db.models.lookups import GreaterThan

from inference.models import LLM
from leaderboard import fixing, ratings, style
from leaderboard.models import LeaderboardRefresh
from votes.models import Battle, FixEpisode, FlaggedVoter, Task, Vote

OVERALL, FIXING, AFTER_CORRECTION = "overall", "fixing", "after_correction"
TASK_PREFIX = "task:"
TITLES = {
    OVERALL: "Overall (first replies)",
    FIXING: "Fixing mistakes (fix-ability)",
    AFTER_CORRECTION: "Preference after correction",
}
# Categories rated from fix episodes rather than votes (leaderboard.fixing).
EPISODE_CATEGORIES = (FIXING,)


def _raw_rows(queryset: QuerySet) -> list[tuple]:
    """A grouped queryset's rows as the database returns them. Its columns need no conversion,
    and Django's per-value converters cost more than the query itself on a million rows."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def categories() -> list[tuple[str, str]]:
    """Every category: overall, fixing mistakes, preference after correction, and one per task
    category."""
    task_categories = sorted(set(Task.objects.exclude(category="").values_list("category", flat=True)))
    return [(key, TITLES[key]) for key in (OVERALL, FIXING, AFTER_CORRECTION)] + [
        (f"{TASK_PREFIX}{name}", f"Task category: {name}") for name in task_categories
    ]


def in_category(votes: QuerySet[Vote], category: str) -> QuerySet[Vote]:
    """The votes among ``votes`` that a category is about (before any exclusion).

    Overall and task categories take each battle's first-try vote: both sides answered the same
    prompts, untouched. A later vote can compare a corrected reply with the other side's
    uncorrected one (a correction goes to one side), so it is only counted as "preference after
    correction", and only where a wrong reply was corrected before it was cast.
    """
    if category == AFTER_CORRECTION:
        return votes.filter(stage=Vote.Stage.AFTER_FIX).filter(_corrected_before_vote())
    first = votes.filter(stage=Vote.Stage.FIRST_TRY)
    if category == OVERALL:
        return first
    if category.startswith(TASK_PREFIX):
        return first.filter(battle__task__category=category.removeprefix(TASK_PREFIX))
    raise ValueError(f"Unknown leaderboard category {category!r}.")


def _corrected_before_vote() -> Exists:
    """For a query on votes: whether a reply judged wrong was corrected before the vote."""
    return Exists(FixEpisode.objects.filter(battle=OuterRef("battle"), wrong_turn__lt=OuterRef("after_turn")))


def _after_fix_and_corrected() -> Case:
    """``_corrected_before_vote`` for after-fix votes only (false for the others, which the
    database then does not look up: most votes are first-try ones)."""
    return Case(
        When(stage=Vote.Stage.AFTER_FIX, then=_corrected_before_vote()),
        default=Value(False),
        output_field=BooleanField(),
    )


def _categories_of(stage: str, task_category: str | None, corrected: bool) -> list[str]:
    """The categories a vote counts in (``in_category``'s rules, for one grouped row)."""
    if stage == Vote.Stage.FIRST_TRY:
        return [OVERALL] + ([f"{TASK_PREFIX}{task_category}"] if task_category else [])
    return [AFTER_CORRECTION] if corrected else []


def _battle_voter_flags() -> QuerySet[FlaggedVoter]:
    """For a query on votes or messages: the flags (not cleared) of the battle's voter."""
    return FlaggedVoter.objects.filter(voter_key=OuterRef("battle__voter_key"), cleared=False)


def counted_episodes() -> list[fixing.Episode]:
    """The fix episodes the "Fixing mistakes" board rates: of ended battles without an identity
    leak, by unflagged voters. Difficulty cells are the task's scripted turns (free chat: one)."""
    episodes = (
        FixEpisode.objects.filter(battle__state=Battle.State.ENDED, battle__excluded=False)  # Live battles only.
        .exclude(voter_flagged())
        .values_list("model__name", "task__slug", "script_turn", "fixed", "battle__public_id")
        .order_by("pk")
    )
    return [
        fixing.Episode(model, task or "free chat", script_turn or 0, fixed, battle)
        for model, task, script_turn, fixed, battle in episodes
    ]


def excluded_episodes() -> dict[str, int]:
    """Fix episodes left out, per reason (the first that applies). Episodes are recorded for
    ended battles only."""
    live = FixEpisode.objects.filter(battle__isnull=False)
    leaked = live.filter(battle__excluded=True).count()
    flagged = live.filter(battle__excluded=False).filter(voter_flagged()).count()
    return {"identity leak": leaked, "flagged voter": flagged}


def anomaly_rows() -> list[tuple[str, int, int, str, int]]:
    """What anomaly detection reads (leaderboard.anomaly.VoteTable.from_rows): the votes of
    ended battles without an identity leak by voters not flagged yet, counted per (voter, model
    A id, model B id, choice)."""
    return _raw_rows(
        _counted(Vote.objects.all())
        .values_list("battle__voter_key", "battle__model_a_id", "battle__model_b_id", "choice")
        .annotate(n=Count("id"))
        .order_by()
    )


def voter_flagged() -> Exists:
    """For a query on votes or messages: whether the battle's voter is flagged."""
    return Exists(_battle_voter_flags())


def voter_flag_reason() -> Subquery:
    """For a query on votes: why the battle's voter is flagged (None if not)."""
    return Subquery(_battle_voter_flags().values("reason")[:1])


def _counted(votes: QuerySet[Vote]) -> QuerySet[Vote]:
    """Votes of ended battles without an identity leak, by unflagged voters."""
    return votes.filter(battle__state=Battle.State.ENDED, battle__excluded=False).exclude(voter_flagged())


def counted_votes(category: str = OVERALL) -> QuerySet[Vote]:
    """The votes a category counts: ended battles without an identity leak, by unflagged voters."""
    return in_category(_counted(Vote.objects.all()), category)


EXCLUSION_REASONS = ("identity leak", "flagged voter", "unfinished battle")


@dataclass
class BoardCounts:
    """One category's counted votes per unordered pair (model positions i < j): wins of i,
    wins of j, ties; the sum of 1 / pair probability of their battles; and how many votes have
    no recorded probability."""

    cells: dict[tuple[int, int], list[float]]
    inverse: dict[tuple[int, int], float]
    unrecorded: int


@dataclass(frozen=True)
class VoteTally:
    """Every category's counted votes per pair (``boards``) and its votes left out per reason
    (``left_out``), from one aggregate query over every vote (``vote_tally``)."""

    boards: dict[str, BoardCounts]
    left_out: dict[str, dict[str, int]]

    def excluded(self, category: str) -> dict[str, int]:
        return self.left_out.get(category, dict.fromkeys(EXCLUSION_REASONS, 0))


def vote_tally(names: list[str]) -> VoteTally:
    """One pass over the votes for every board: grouped by what decides their categories
    (``in_category``), whether they count (``counted_votes``; else the first reason that
    applies, in ``EXCLUSION_REASONS`` order), their models and choice."""
    index = _positions_by_id(names)
    rows = _raw_rows(
        Vote.objects.annotate(corrected=_after_fix_and_corrected(), flagged=voter_flagged())
        .values_list(
            "stage",
            "battle__task__category",
            "corrected",
            "battle__excluded",
            "flagged",
            "battle__state",
            "battle__model_a_id",
            "battle__model_b_id",
            "choice",
        )
        .annotate(
            n=Count("id"),
            recorded=Count("battle__pair_probability"),
            inverse=Sum(Value(1.0) / F("battle__pair_probability"), output_field=FloatField()),
        )
        .order_by()
    )
    boards: dict[str, BoardCounts] = {}
    left_out: dict[str, dict[str, int]] = {}
    for stage, task_category, corrected, excluded, flagged, state, a_id, b_id, choice, n, recorded, inverse in rows:
        categories = _categories_of(stage, task_category, bool(corrected))
        reason = (
            "identity leak"
            if excluded
            else "flagged voter"
            if flagged
            else "unfinished battle"
            if state != Battle.State.ENDED
            else None
        )
        if reason is not None:
            for category in categories:
                left_out.setdefault(category, dict.fromkeys(EXCLUSION_REASONS, 0))[reason] += n
            continue
        a, b = index[a_id], index[b_id]
        score = ratings.VOTE_SCORES[choice]
        i, j, score_i = (a, b, score) if a < b else (b, a, 1.0 - score)
        outcome = 0 if score_i == 1.0 else 1 if score_i == 0.0 else 2
        for category in categories:
            board = boards.setdefault(category, BoardCounts({}, {}, 0))
            board.cells.setdefault((i, j), [0.0, 0.0, 0.0])[outcome] += n
            board.inverse[(i, j)] = board.inverse.get((i, j), 0.0) + (inverse or 0.0)
            board.unrecorded += n - recorded
    return VoteTally(boards, left_out)


def excluded_votes(category: str = OVERALL) -> dict[str, int]:
    """Votes of the category left out, per reason (the first that applies, in this order)."""
    return vote_tally(roster_names()).excluded(category)


def board_counts(names: list[str]) -> dict[str, BoardCounts]:
    """Every vote board's counts (``vote_tally``)."""
    return vote_tally(names).boards


@dataclass(frozen=True)
class CategoryData:
    names: list[str]
    outcomes: ratings.PairOutcomes
    new_games: list[tuple[int, int, float]]  # Counted since the Elo marker, in Elo order.
    elo_through: tuple[Any, int]  # The new marker: (battle end, vote id) of the last game.
    # Votes counted now up to the old marker: when it differs from what Elo took then, a vote
    # was excluded (or let back in) since, and Elo must start again from every counted vote.
    counted_before: int
    # Per pair (in ``outcomes`` order): the mean inverse sampling probability of its votes' battles;
    # None when a counted battle has none recorded (drawn before it was).
    pair_weights: np.ndarray | None = None


def _positions_by_id(names: list[str]) -> dict[int, int]:
    """Each model's id -> its position in ``names``: votes grouped by model id need not join
    the models' table."""
    position = {name: i for i, name in enumerate(names)}
    return {pk: position[name] for pk, name in LLM.objects.values_list("pk", "name") if name in position}


def category_data(
    category: str,
    names: list[str],
    elo_through: tuple[Any, int] | None = None,
    counts: BoardCounts | None = None,
) -> CategoryData:
    """The category's votes reduced to pairwise counts (``counts``, from ``board_counts``, or
    its own aggregate query), and the votes counted since ``elo_through`` for online Elo (so a
    refresh reads only the new ones).

    A vote counts once its battle has ended, and a battle takes no vote after that: the order
    (battle end, vote id) never has to be replayed.
    """
    index = _positions_by_id(names)
    votes = counted_votes(category)
    if counts is None:
        counts = board_counts(names).get(category, BoardCounts({}, {}, 0))
    cells = counts.cells
    # Inverse-probability weights (the mean over the pair's votes, as PairOutcomes keeps one
    # weight per pair): only when every counted battle recorded its probability.
    pair_weights = (
        np.array([counts.inverse[key] / sum(cells[key]) for key in sorted(cells)])
        if cells and not counts.unrecorded
        else None
    )
    new = votes
    if elo_through is not None and elo_through[0] is not None:
        ended, vote_id = elo_through
        new = votes.filter(Q(battle__ended__gt=ended) | Q(battle__ended=ended, pk__gt=vote_id))
    history = new.order_by("battle__ended", "pk").values_list(
        "battle__model_a_id", "battle__model_b_id", "choice", "battle__ended", "pk"
    )
    games, marker = [], elo_through or (None, 0)
    for a_id, b_id, choice, ended, pk in history:
        games.append((index[a_id], index[b_id], ratings.VOTE_SCORES[choice]))
        marker = (ended, pk)
    outcomes = ratings.PairOutcomes.from_cells(len(names), cells)
    # The votes up to the marker are the counted ones less those after it: no second count. (A
    # vote cast between the two queries makes this one lower, and Elo merely starts again.)
    counted_before = round(outcomes.total) - len(games) if elo_through is not None and elo_through[0] else 0
    return CategoryData(names, outcomes, games, marker, counted_before, pair_weights)


def style_outcomes(category: str, names: list[str]) -> style.StyleOutcomes:
    """The category's counted votes reduced to style cells (leaderboard.style) by one aggregate
    query: each vote stores the style of what its voter had seen (``Vote.seen_*``), the database
    rounds the four differences to ``style.BINS`` steps as ``style.rounded_steps`` does and counts
    the votes per (models, choice, steps), and only those counts leave it."""
    by_id = _positions_by_id(names)
    position = np.full(max(by_id, default=0) + 1, -1)
    position[list(by_id)] = list(by_id.values())
    steps = {}
    for feature in style.FEATURES:
        a, b = F(f"seen_{feature}_a"), F(f"seen_{feature}_b")
        difference = Case(When(GreaterThan(a + b, 0.0), then=(a - b) / (a + b)), default=Value(0.0))
        steps[f"step_{feature}"] = Sign(difference) * Floor(Abs(difference) / style.BINS + 0.5)
    score = Case(
        *(When(choice=choice, then=Value(value)) for choice, value in ratings.VOTE_SCORES.items()),
        output_field=FloatField(),
    )
    rows = _raw_rows(
        counted_votes(category)
        .annotate(score_a=score, **steps)
        .values_list("battle__model_a_id", "battle__model_b_id", "score_a", *steps)
        .annotate(n=Count("id"))
        .order_by()
    )
    if not rows:
        return style.StyleOutcomes.from_votes(len(names), [])
    table = np.array(rows, dtype=float)  # Every column is a number: one conversion.
    a, b = position[table[:, 0].astype(int)], position[table[:, 1].astype(int)]
    difference = table[:, 3:7] * style.BINS
    return style.StyleOutcomes.from_arrays(len(names), a, b, table[:, 2], difference, counts=table[:, 7])


def fix_rates(names: list[str]) -> dict[str, dict[str, ratings.FixRate]]:
    """Per model, the share of its counted fix episodes (a reply judged wrong, a correction, the
    reply to it) whose answer fixed the mistake: as the voter rated them (🍄/🔥, then 🥦 or ✓)
    and as the checker judged them (wrong, then correct), each judge's episodes alone. One
    aggregate over the stored episodes (votes.services.record_fix_episodes)."""
    tallies = (
        FixEpisode.objects.filter(battle__state=Battle.State.ENDED, battle__excluded=False)
        .exclude(voter_flagged())
        .values("model__name")
        .annotate(
            by_voter_fixed=Count("pk", filter=Q(voter_fixed=True)),
            by_voter=Count("voter_fixed"),
            by_checker_fixed=Count("pk", filter=Q(checker_fixed=True)),
            by_checker=Count("checker_fixed"),
        )
        .order_by()
    )
    counts = {row["model__name"]: row for row in tallies}
    rates = {}
    for name in names:
        row = counts.get(name, {})
        rates[name] = {
            "voters": ratings.fix_rate(row.get("by_voter_fixed", 0), row.get("by_voter", 0)),
            "checker": ratings.fix_rate(row.get("by_checker_fixed", 0), row.get("by_checker", 0)),
        }
    return rates


def base_model_names() -> set[str]:
    """Pretrained base models (not tuned to chat), labelled as such wherever they are ranked."""
    return set(LLM.objects.filter(base=True).values_list("name", flat=True))


def roster_names() -> list[str]:
    return list(LLM.objects.order_by("name").values_list("name", flat=True))


def latest_refresh() -> LeaderboardRefresh | None:
    return LeaderboardRefresh.objects.order_by("-created", "-pk").first()


def refresh_by_id(refresh_id: int) -> LeaderboardRefresh | None:
    return LeaderboardRefresh.objects.filter(pk=refresh_id).first()


def recent_refreshes(limit: int = 30) -> list[LeaderboardRefresh]:
    return list(LeaderboardRefresh.objects.order_by("-created", "-pk")[:limit])


def new_votes_since(refresh: LeaderboardRefresh | None) -> int:
    return Vote.objects.filter(pk__gt=refresh.last_vote_id if refresh else 0).count()
