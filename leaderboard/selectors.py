"""Reads for the leaderboard: votes reduced to per-category pairwise counts, fix rates, snapshots."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Count,
    Exists,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Abs, Cast, Floor, Sign
from django.db.models.lookups import GreaterThan

from inference.models import LLM
from leaderboard import anomaly, fixing, ratings, style, tally
from leaderboard.models import LeaderboardRefresh, VoteTallyState
from votes.models import Battle, FixEpisode, FlaggedNetwork, FlaggedVoter, Message, Rating, Task, Verdict, Vote

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
    try:
        sql, params = queryset.query.sql_with_params()
    except EmptyResultSet:  # A filter that can match nothing (``pk__in=[]``).
        return []
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


def voter_flagged() -> Exists:
    """For a query on votes or messages: whether the battle's voter is flagged."""
    return Exists(_battle_voter_flags())


def voter_flag_reason() -> Subquery:
    """For a query on votes: why the battle's voter is flagged (None if not)."""
    return Subquery(_battle_voter_flags().values("reason")[:1])


def _counted(votes: QuerySet[Vote]) -> QuerySet[Vote]:
    """Votes of ended battles without an identity leak, by unflagged voters."""
    return votes.filter(battle__state=Battle.State.ENDED, battle__excluded=False, over_daily_cap=False).exclude(
        voter_flagged()
    )


def counted_votes(category: str = OVERALL) -> QuerySet[Vote]:
    """The votes a category counts: ended battles without an identity leak, by unflagged voters."""
    return in_category(_counted(Vote.objects.all()), category)


def every_counted_vote() -> QuerySet[Vote]:
    """The votes some category counts, of every stage and category."""
    return _counted(Vote.objects.all())


EXCLUSION_REASONS = ("identity leak", "flagged voter", "over daily cap", "unfinished battle")


@dataclass
class BoardCounts:
    """One category's counted votes per unordered pair (model positions i < j): wins of i,
    wins of j, ties; the sum of 1 / pair probability of their battles; how many votes have
    no recorded probability; and the same votes per voter (``voters``, in the roster's
    positions: what the intervals clustered by voter read)."""

    cells: dict[tuple[int, int], list[float]]
    inverse: dict[tuple[int, int], float]
    unrecorded: int
    voters: ratings.VoterCells | None = None


@dataclass(frozen=True)
class VoteTally:
    """Every category's counted votes per pair (``boards``) and its votes left out per reason
    (``left_out``) (``vote_tally``)."""

    boards: dict[str, BoardCounts]
    left_out: dict[str, dict[str, int]]

    def excluded(self, category: str) -> dict[str, int]:
        return self.left_out.get(category, dict.fromkeys(EXCLUSION_REASONS, 0))


def _vote_rows(votes: QuerySet[Vote]) -> list[tally.VoteRow]:
    """``votes`` grouped by what decides where they count (``in_category``; an identity leak;
    the voter), their models and choice (``tally.VoteRow``)."""
    rows = _raw_rows(
        votes.annotate(corrected=_after_fix_and_corrected())
        .values_list(
            "battle__voter_key",
            "stage",
            "battle__task__category",
            "corrected",
            "battle__excluded",
            "battle__model_a_id",
            "battle__model_b_id",
            "choice",
            "over_daily_cap",
            "battle__mode",
        )
        .annotate(
            n=Count("id"),
            recorded=Count("battle__pair_probability"),
            inverse=Sum(Value(1.0) / F("battle__pair_probability"), output_field=FloatField()),
        )
        .order_by()
    )
    return [
        tally.VoteRow(
            voter,
            _categories_of(stage, task_category, bool(corrected)),
            excluded,
            a_id,
            b_id,
            choice,
            n,
            recorded,
            inverse or 0.0,
            over_cap,
            mode == Battle.Mode.ANONYMOUS,
        )
        for (
            voter,
            stage,
            task_category,
            corrected,
            excluded,
            a_id,
            b_id,
            choice,
            over_cap,
            mode,
            n,
            recorded,
            inverse,
        ) in rows
    ]


def _style_rows(votes: QuerySet[Vote]) -> list[tuple]:
    """``votes`` as style cells by one aggregate query: each vote stores the style of what its
    voter had seen (``Vote.seen_*``), the database rounds the four differences to
    ``style.BINS`` steps as ``style.rounded_steps`` does and counts the votes per (models,
    choice, steps), and only those counts leave it."""
    steps = {}
    for feature in style.FEATURES:
        a, b = F(f"seen_{feature}_a"), F(f"seen_{feature}_b")
        difference = Case(When(GreaterThan(a + b, 0.0), then=(a - b) / (a + b)), default=Value(0.0))
        steps[f"step_{feature}"] = Cast(Sign(difference) * Floor(Abs(difference) / style.BINS + 0.5), IntegerField())
    return _raw_rows(
        votes.annotate(**steps)
        .values_list("battle__voter_key", "battle__model_a_id", "battle__model_b_id", "choice", *steps)
        .annotate(n=Count("id"))
        .order_by()
    )


def _episode_rows(episodes: QuerySet[FixEpisode]) -> list[tally.EpisodeRow]:
    """Fix episodes grouped per battle and by everything the fix-ability board reads."""
    rows = _raw_rows(
        episodes.values_list(
            "battle_id",
            "battle__voter_key",
            "battle__excluded",
            "model_id",
            "task_id",
            "script_turn",
            "fixed",
            "voter_fixed",
            "checker_fixed",
            "specificity",
            "attempt",
        )
        .annotate(n=Count("id"))
        .order_by()
    )
    return [tally.EpisodeRow(*row) for row in rows]


def _reply_rows(battles: Q) -> list[tally.ReplyRow]:
    """The first tries of the battles ``battles`` selects (replies to a prompt both sides got:
    not answers to a correction) that the voter rated or the checker judged, per battle side and
    whether they were judged wrong (voter 🍄/🔥 or checker mistake/garbage)."""
    wrong = Q(rating__in=(Rating.MISTAKE, Rating.GARBAGE)) | Q(check_verdict__in=(Verdict.MISTAKE, Verdict.GARBAGE))
    both_sides = Exists(
        Message.objects.filter(battle=OuterRef("battle"), turn=OuterRef("turn"), role=Message.Role.USER).exclude(
            side=OuterRef("side")
        )
    )
    rows = _raw_rows(
        Message.objects.filter(battles, both_sides, role=Message.Role.ASSISTANT)
        .exclude(rating="", check_verdict="")
        .annotate(
            judged_model=Case(When(side="a", then=F("battle__model_a_id")), default=F("battle__model_b_id")),
            wrong=Case(When(wrong, then=Value(True)), default=Value(False), output_field=BooleanField()),
        )
        .values_list("battle__voter_key", "battle__excluded", "judged_model", "wrong")
        .annotate(n=Count("id"))
        .order_by()
    )
    return [tally.ReplyRow(*row) for row in rows]


def battles_tally(battles: Q, flagged: frozenset[str]) -> tally.Tally:
    """The tally (``leaderboard.tally``) of the votes and fix episodes of the battles
    ``battles`` selects (a filter on a ``battle`` foreign key), with the ``flagged`` voters'
    left out."""
    votes = Vote.objects.filter(battles)
    overall = in_category(votes.filter(battle__excluded=False, over_daily_cap=False), OVERALL).exclude(
        battle__voter_key__in=flagged
    )
    episodes = _episode_rows(FixEpisode.objects.filter(battles))
    return tally.tally_of(_vote_rows(votes), _style_rows(overall), episodes, flagged, FIXING, _reply_rows(battles))


def stored_tally() -> tally.Tally | None:
    """The running counts the latest refresh stored (``VoteTallyState``), if any can be read.
    PostgreSQL sends them in its binary format: in text, as hex, they would be twice the size
    and cost more to decode than to fetch."""
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(f"SELECT data FROM {VoteTallyState._meta.db_table} WHERE id = 1", binary=True)
            row = cursor.fetchone()
        data = bytes(row[0]) if row else b""
    else:
        data = bytes(VoteTallyState.objects.filter(pk=1).values_list("data", flat=True).first() or b"")
    return tally.Tally.from_bytes(data) if data else None


def flagged_voters() -> frozenset[str]:
    """The voters whose votes stay out (flagged, not cleared)."""
    return frozenset(FlaggedVoter.objects.filter(cleared=False).values_list("voter_key", flat=True))


def network_detector_table() -> anomaly.VoteTable:
    """The anomaly detector's input grouped by client network (``Battle.network_key``) instead
    of by voter: the votes of the counted anonymous battles (an identity leak's included), by
    voters not flagged, from networks known and not flagged already. One GROUP BY over the
    counted votes."""
    votes = (
        Vote.objects.filter(battle__tallied=True, battle__mode=Battle.Mode.ANONYMOUS)
        .exclude(battle__network_key="")
        .exclude(voter_flagged())
        .exclude(battle__network_key__in=FlaggedNetwork.objects.filter(cleared=False).values("network_key"))
    )
    rows = _raw_rows(
        votes.values_list("battle__network_key", "battle__model_a_id", "battle__model_b_id", "choice")
        .annotate(n=Count("id"))
        .order_by()
    )
    return anomaly.VoteTable.from_rows(rows)


def network_voter_rows(network_keys: list[str]) -> list[tuple[str, str, int, int, str, int]]:
    """The votes of the counted anonymous battles (an identity leak's included) from the
    networks ``network_keys``, flagged voters' included, as (network key, voter key, model A id,
    model B id, choice, count) rows: ``anomaly.campaign_voters``'s input."""
    votes = Vote.objects.filter(
        battle__tallied=True, battle__mode=Battle.Mode.ANONYMOUS, battle__network_key__in=network_keys
    )
    return [
        tuple(row)
        for row in votes.values_list(
            "battle__network_key", "battle__voter_key", "battle__model_a_id", "battle__model_b_id", "choice"
        )
        .annotate(n=Count("id"))
        .order_by()
    ]


def current_tally() -> tally.Tally:
    """Every ended battle's votes counted from scratch, as the flags are now (what a refresh's
    running counts must equal)."""
    return battles_tally(Q(battle__state=Battle.State.ENDED), flagged_voters())


def vote_tally(names: list[str], counts: tally.Tally | None = None) -> VoteTally:
    """Every board's counted votes per pair and what each leaves out, from the ended battles'
    counts (``counts``, a refresh's running tally; by default counted now) and the votes of the
    battles not ended yet (read now: few)."""
    counts = current_tally() if counts is None else counts
    n = len(names)
    position = _position_array(names)
    keys, values = counts.boards.keys, counts.boards.values
    a, b = position[keys[:, 1]], position[keys[:, 2]]
    score = np.array([ratings.VOTE_SCORES[choice] for choice in tally.CHOICES])[keys[:, 3]]
    score_i = np.where(a < b, score, 1.0 - score)  # For the pair's first model (i < j).
    outcome = np.where(score_i == 1.0, 0, np.where(score_i == 0.0, 1, 2))
    pair = np.minimum(a, b) * n + np.maximum(a, b)
    # The votes per voter, once each (by class: the categories a vote counts in), sorted by voter.
    per_voter = counts.voter_boards.keys
    first_position, second_position = position[per_voter[:, 2]], position[per_voter[:, 3]]
    score_first = np.array(tally.OUTCOMES)[per_voter[:, 4]]  # Of the model with the smaller id.
    score_first = np.where(first_position < second_position, score_first, 1.0 - score_first)
    voter_outcome = np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2))
    low, high = np.minimum(first_position, second_position), np.maximum(first_position, second_position)
    boards: dict[str, BoardCounts] = {}
    for code, category in enumerate(counts.categories):
        rows = keys[:, 0] == code
        if category in EPISODE_CATEGORIES or not rows.any():
            continue
        cells = np.bincount(pair[rows] * 3 + outcome[rows], values[rows, 0], minlength=n * n * 3).reshape(-1, 3)
        inverse = np.bincount(pair[rows], values[rows, 2], minlength=n * n)
        played = np.flatnonzero(cells.sum(axis=1))
        kinds = [kind for kind, name in enumerate(counts.classes) if category in name.split("|")]
        mine = np.isin(per_voter[:, 1], kinds)
        voters = ratings.VoterCells(
            n, per_voter[mine, 0], low[mine], high[mine], voter_outcome[mine], counts.voter_boards.values[mine, 0]
        )
        boards[category] = BoardCounts(
            {(p // n, p % n): cells[p].tolist() for p in played.tolist()},
            {(p // n, p % n): float(inverse[p]) for p in played.tolist()},
            round(values[rows, 0].sum() - values[rows, 1].sum()),
            voters,
        )
    left_out: dict[str, dict[str, int]] = {}
    for (category, reason), (votes,) in zip(
        counts.left_out.keys.tolist(), counts.left_out.values.tolist(), strict=True
    ):
        if counts.categories[category] not in EPISODE_CATEGORIES:
            left = left_out.setdefault(counts.categories[category], dict.fromkeys(EXCLUSION_REASONS, 0))
            left[tally.LEFT_OUT_REASONS[reason]] += round(votes)
    # Votes of unfinished battles count nowhere yet: left out, for the first reason that applies
    # (the voters flagged as the counts have them, so that both agree).
    flagged = counts.flagged
    unfinished = Vote.objects.filter(battle__tallied=False).exclude(battle__state=Battle.State.ENDED)
    for row in _vote_rows(unfinished):
        reason = (
            "identity leak"
            if row.leaked
            else "flagged voter"
            if row.voter in flagged
            else "over daily cap"
            if row.over_cap
            else "unfinished battle"
        )
        for category in row.categories:
            left_out.setdefault(category, dict.fromkeys(EXCLUSION_REASONS, 0))[reason] += row.votes
    return VoteTally(boards, left_out)


def excluded_votes(category: str = OVERALL) -> dict[str, int]:
    """Votes of the category left out, per reason (the first that applies, in this order)."""
    return vote_tally(roster_names()).excluded(category)


@dataclass(frozen=True)
class CategoryData:
    names: list[str]
    outcomes: ratings.PairOutcomes
    # Per pair (in ``outcomes`` order): the mean inverse sampling probability of its votes' battles;
    # None when a counted battle has none recorded (drawn before it was).
    pair_weights: np.ndarray | None = None
    # The same votes per voter (the intervals are clustered by voter).
    voters: ratings.VoterCells | None = None


def _positions_by_id(names: list[str]) -> dict[int, int]:
    """Each model's id -> its position in ``names``: votes grouped by model id need not join
    the models' table."""
    position = {name: i for i, name in enumerate(names)}
    return {pk: position[name] for pk, name in LLM.objects.values_list("pk", "name") if name in position}


def _position_array(names: list[str]) -> np.ndarray:
    """``_positions_by_id`` as an array indexed by model id (-1: not in ``names``)."""
    by_id = _positions_by_id(names)
    position = np.full(max(by_id, default=0) + 1, -1)
    position[list(by_id)] = list(by_id.values())
    return position


def category_data(category: str, names: list[str], counts: BoardCounts | None = None) -> CategoryData:
    """The category's votes reduced to pairwise counts (``counts``, from ``vote_tally``, or
    counted now), and the pairs' inverse-probability weights."""
    if counts is None:
        counts = vote_tally(names).boards.get(category, BoardCounts({}, {}, 0))
    cells = counts.cells
    # Inverse-probability weights (the mean over the pair's votes, as PairOutcomes keeps one
    # weight per pair): only when every counted battle recorded its probability.
    pair_weights = (
        np.array([counts.inverse[key] / sum(cells[key]) for key in sorted(cells)])
        if cells and not counts.unrecorded
        else None
    )
    voters = counts.voters if counts.voters is not None else ratings.VoterCells.from_votes(len(names), [])
    return CategoryData(names, ratings.PairOutcomes.from_cells(len(names), cells), pair_weights, voters)


@dataclass
class EloGames:
    """A category's counted votes for online Elo, in the order it takes them (battle end, vote
    id): (position of A, position of B, score of A), and the last one's (battle end, vote id)."""

    games: list[tuple[int, int, float]]
    through: tuple[Any, int] = (None, 0)


def elo_games(battles: Q, names: list[str], flagged: frozenset[str]) -> dict[str, EloGames]:
    """Every category's counted votes among the battles ``battles`` selects (a filter on votes),
    ``flagged`` voters' left out, in online Elo's order; one query.

    A vote counts once its battle has ended, and a battle takes no vote after that: a refresh
    passes the battles ended since the last one, whose votes come after every vote Elo took."""
    index = _positions_by_id(names)
    votes = (
        Vote.objects.filter(battles, battle__excluded=False, over_daily_cap=False)
        .exclude(battle__voter_key__in=flagged)
        .annotate(corrected=_after_fix_and_corrected())
        .order_by("battle__ended", "pk")
        .values_list(
            "stage",
            "battle__task__category",
            "corrected",
            "battle__model_a_id",
            "battle__model_b_id",
            "choice",
            "battle__ended",
            "pk",
        )
    )
    by_category: dict[str, EloGames] = {}
    for stage, task_category, corrected, a_id, b_id, choice, ended, pk in votes:
        game = (index[a_id], index[b_id], ratings.VOTE_SCORES[choice])
        for category in _categories_of(stage, task_category, bool(corrected)):
            games = by_category.setdefault(category, EloGames([]))
            games.games.append(game)
            games.through = (ended, pk)
    return by_category


def style_outcomes(names: list[str], counts: tally.Tally | None = None) -> style.StyleOutcomes:
    """The overall board's counted votes as style cells (leaderboard.style), from the ended
    battles' counts (``counts``, a refresh's running tally; by default counted now)."""
    counts = current_tally() if counts is None else counts
    if not len(counts.style.keys):
        return style.StyleOutcomes.from_votes(len(names), [])
    position = _position_array(names)
    keys = counts.style.keys
    return style.StyleOutcomes.from_arrays(
        len(names),
        position[keys[:, 1]],
        position[keys[:, 2]],
        np.array(tally.OUTCOMES)[keys[:, 3]],
        keys[:, 4:8] * style.BINS,
        counts=counts.style.values[:, 0],
    )


def style_voters(names: list[str], counts: tally.Tally | None = None) -> style.StyleVoters:
    """The overall board's counted votes as style rows per voter (what style control's
    intervals, clustered by voter, read), from the same counts as ``style_outcomes``."""
    counts = current_tally() if counts is None else counts
    position = _position_array(names)
    keys = counts.style.keys
    a, b = (position[keys[:, 1]], position[keys[:, 2]]) if len(keys) else (keys[:, 1], keys[:, 2])
    return style.StyleVoters(
        len(names),
        keys[:, 0],
        a,
        b,
        np.array(tally.OUTCOMES)[keys[:, 3]],
        keys[:, 4:8] * style.BINS,
        counts.style.values[:, 0],
    )


def fix_episode_counts(counts: tally.Tally | None = None) -> fixing.EpisodeCounts:
    """The fix episodes the "Fixing mistakes" board rates (of ended battles without an identity
    leak, by unflagged voters), from a refresh's running counts (by default counted now), as
    fix-ability reads them. Difficulty cells are the task's scripted turns; free chat's episodes
    are one cell, "free chat" (``fixing.FREE_CHAT``), whose difficulty fix-ability takes per
    battle (the cluster)."""
    counts = current_tally() if counts is None else counts
    keys, number = counts.episodes.keys, counts.episodes.values[:, 0]
    names = dict(LLM.objects.values_list("pk", "name"))
    slugs = {0: fixing.FREE_CHAT, **dict(Task.objects.values_list("pk", "slug"))}
    model_ids, model = np.unique(keys[:, 0], return_inverse=True)
    models = sorted(names[pk] for pk in model_ids.tolist())
    model_position = {name: i for i, name in enumerate(models)}
    cell_keys, cell = np.unique(keys[:, 1:3], axis=0, return_inverse=True)
    cells = sorted((slugs[task], turn) for task, turn in cell_keys.tolist())
    cell_position = {name: i for i, name in enumerate(cells)}
    battles = keys[:, 6]
    shared = battles != 0  # Else each of the row's episodes is a cluster of its own.
    cluster = np.full(len(battles), -1, dtype=np.intp)
    cluster[shared] = np.unique(battles[shared], return_inverse=True)[1].reshape(-1)
    return fixing.EpisodeCounts(
        models=models,
        cells=cells,
        model=np.array([model_position[names[pk]] for pk in model_ids.tolist()], dtype=np.intp)[model.reshape(-1)],
        cell=np.array([cell_position[slugs[t], turn] for t, turn in cell_keys.tolist()], dtype=np.intp)[
            cell.reshape(-1)
        ],
        fixed=keys[:, 3].astype(float),
        count=number,
        cluster=cluster,
        kind=keys[:, 7].astype(np.intp),
        attempt=keys[:, 8].astype(np.intp),
        voter=np.unique(keys[:, 9], return_inverse=True)[1].reshape(-1).astype(np.intp),
    )


def wrong_rates(names: list[str], counts: tally.Tally | None = None) -> dict[str, ratings.FixRate]:
    """Per model, of its first tries in counted battles (replies to a prompt both sides got) that
    the voter rated or the checker judged, how many were judged wrong: the rate at which its fix
    episodes start (a model rarely wrong is wrong on harder prompts, which fix-ability's
    selection treatment reports beside it). As a ``FixRate``: ``fixed`` the wrong ones,
    ``corrections`` the judged ones."""
    counts = current_tally() if counts is None else counts
    keys, number = counts.replies.keys, counts.replies.values[:, 0]
    by_id = _position_array(names)
    position = np.where(keys[:, 0] < len(by_id), by_id[np.minimum(keys[:, 0], len(by_id) - 1)], -1)
    known = position >= 0
    judged = np.bincount(position[known], number[known], minlength=len(names))
    wrong = np.bincount(position[known & (keys[:, 1] == 1)], number[known & (keys[:, 1] == 1)], minlength=len(names))
    return {name: ratings.fix_rate(round(wrong[i]), round(judged[i])) for i, name in enumerate(names)}


def excluded_episodes(counts: tally.Tally | None = None) -> dict[str, int]:
    """Fix episodes left out, per reason (the first that applies). Episodes are recorded for
    ended battles only."""
    counts = current_tally() if counts is None else counts
    left = dict.fromkeys(tally.LEFT_OUT_REASONS[:2], 0)  # Episodes are never over a vote cap.
    if FIXING in counts.categories:
        code = counts.categories.index(FIXING)
        for (category, reason), (n,) in zip(
            counts.left_out.keys.tolist(), counts.left_out.values.tolist(), strict=True
        ):
            if category == code:
                left[tally.LEFT_OUT_REASONS[reason]] += round(n)
    return left


def fix_rates(names: list[str], counts: tally.Tally | None = None) -> dict[str, dict[str, ratings.FixRate]]:
    """Per model, the share of its counted fix episodes (a reply judged wrong, a correction, the
    reply to it) whose answer fixed the mistake: as the voter rated them (🍄/🔥, then 🥦 or ✓)
    and as the checker judged them (wrong, then correct), each judge's episodes alone. From a
    refresh's running counts (by default counted now) of the stored episodes
    (votes.services.record_fix_episodes)."""
    counts = current_tally() if counts is None else counts
    keys, number = counts.episodes.keys, counts.episodes.values[:, 0]
    position = _position_array(names)[keys[:, 0]] if len(keys) else np.zeros(0, dtype=np.intp)
    known = position >= 0

    def per_model(judged: np.ndarray) -> np.ndarray:
        return np.bincount(position[known & judged], number[known & judged], minlength=len(names))

    rates = {}
    tallies = {
        judge: (per_model(keys[:, column] == 2), per_model(keys[:, column] > 0))
        for judge, column in (("voters", 4), ("checker", 5))
    }
    for i, name in enumerate(names):
        rates[name] = {
            judge: ratings.fix_rate(round(fixed[i]), round(judged[i])) for judge, (fixed, judged) in tallies.items()
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
