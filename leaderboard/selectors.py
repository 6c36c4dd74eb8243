"""Reads for the leaderboard: votes reduced to per-category pairwise counts, fix rates, snapshots."""

from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import Count, Exists, F, FloatField, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Cast, Coalesce, Length

from inference.models import LLM
from leaderboard import fixing, ratings, style
from leaderboard.models import LeaderboardRefresh
from votes.models import Battle, FixEpisode, FlaggedVoter, Message, Task, Vote

OVERALL, FIXING, AFTER_CORRECTION = "overall", "fixing", "after_correction"
TASK_PREFIX = "task:"
TITLES = {
    OVERALL: "Overall (first replies)",
    FIXING: "Fixing mistakes (fix-ability)",
    AFTER_CORRECTION: "Preference after correction",
}
# Categories rated from fix episodes rather than votes (leaderboard.fixing).
EPISODE_CATEGORIES = (FIXING,)


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
        corrected = FixEpisode.objects.filter(battle=OuterRef("battle"), wrong_turn__lt=OuterRef("after_turn"))
        return votes.filter(stage=Vote.Stage.AFTER_FIX).filter(Exists(corrected))
    first = votes.filter(stage=Vote.Stage.FIRST_TRY)
    if category == OVERALL:
        return first
    if category.startswith(TASK_PREFIX):
        return first.filter(battle__task__category=category.removeprefix(TASK_PREFIX))
    raise ValueError(f"Unknown leaderboard category {category!r}.")


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


def voter_flagged() -> Exists:
    """For a query on votes or messages: whether the battle's voter is flagged."""
    return Exists(_battle_voter_flags())


def voter_flag_reason() -> Subquery:
    """For a query on votes: why the battle's voter is flagged (None if not)."""
    return Subquery(_battle_voter_flags().values("reason")[:1])


def counted_votes(category: str = OVERALL) -> QuerySet[Vote]:
    """The votes a category counts: ended battles without an identity leak, by unflagged voters."""
    votes = Vote.objects.filter(battle__state=Battle.State.ENDED, battle__excluded=False).exclude(voter_flagged())
    return in_category(votes, category)


def excluded_votes(category: str = OVERALL) -> dict[str, int]:
    """Votes of the category left out, per reason (the first that applies, in this order)."""
    votes = in_category(Vote.objects.all(), category)
    leaked = votes.filter(battle__excluded=True)
    flagged = votes.filter(battle__excluded=False).filter(voter_flagged())
    unfinished = votes.filter(battle__excluded=False).exclude(voter_flagged()).exclude(battle__state=Battle.State.ENDED)
    return {"identity leak": leaked.count(), "flagged voter": flagged.count(), "unfinished battle": unfinished.count()}


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


def category_data(category: str, names: list[str], elo_through: tuple[Any, int] | None = None) -> CategoryData:
    """The category's votes reduced to pairwise counts by one aggregate query, and the votes
    counted since ``elo_through`` for online Elo (so a refresh reads only the new ones).

    A vote counts once its battle has ended, and a battle takes no vote after that: the order
    (battle end, vote id) never has to be replayed.
    """
    index = _positions_by_id(names)
    votes = counted_votes(category)
    cells: dict[tuple[int, int], list[float]] = {}
    inverse: dict[tuple[int, int], float] = {}  # Sum of 1 / pair probability, per pair.
    unrecorded = 0  # Votes whose battle has no recorded pair probability.
    grouped = votes.values("battle__model_a_id", "battle__model_b_id", "choice").annotate(
        n=Count("id"),
        recorded=Count("battle__pair_probability"),
        inverse=Sum(Value(1.0) / F("battle__pair_probability"), output_field=FloatField()),
    )
    for row in grouped.order_by():
        a, b = index[row["battle__model_a_id"]], index[row["battle__model_b_id"]]
        score = ratings.VOTE_SCORES[row["choice"]]
        i, j, score_i = (a, b, score) if a < b else (b, a, 1.0 - score)
        cell = cells.setdefault((i, j), [0.0, 0.0, 0.0])
        cell[0 if score_i == 1.0 else 1 if score_i == 0.0 else 2] += row["n"]
        inverse[(i, j)] = inverse.get((i, j), 0.0) + (row["inverse"] or 0.0)
        unrecorded += row["n"] - row["recorded"]
    # Inverse-probability weights (the mean over the pair's votes, as PairOutcomes keeps one
    # weight per pair): only when every counted battle recorded its probability.
    pair_weights = (
        np.array([inverse[key] / sum(cells[key]) for key in sorted(cells)]) if cells and not unrecorded else None
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
    """The category's counted votes with the style differences of the replies each voter had
    seen (length in tokens, markdown counts, leaderboard.style), reduced to cells.

    The database sums each side's replies up to the vote's turn, one row per vote; the markdown
    was counted when each reply finished, so no reply's text leaves the database (its length
    stands in only for a reply without a token count)."""
    index = _positions_by_id(names)
    reply = "battle__messages__"
    length = Coalesce(Cast(f"{reply}token_count", FloatField()), Cast(Length(f"{reply}content"), FloatField()) / 4.0)
    sums = {}
    for side in "ab":
        seen = Q(**{f"{reply}role": Message.Role.ASSISTANT, f"{reply}side": side, f"{reply}turn__lte": F("after_turn")})
        sums[f"length_{side}"] = Sum(length, filter=seen, default=0.0, output_field=FloatField())
        for feature, field in (("headers", "header_count"), ("lists", "list_count"), ("bold", "bold_count")):
            sums[f"{feature}_{side}"] = Sum(
                Cast(f"{reply}{field}", FloatField()), filter=seen, default=0.0, output_field=FloatField()
            )
    rows = (
        counted_votes(category)
        .annotate(**sums)
        .values_list("battle__model_a_id", "battle__model_b_id", "choice", *sums)
    )
    columns = list(zip(*rows, strict=True))
    if not columns:
        return style.StyleOutcomes.from_votes(len(names), [])
    a = np.array([index[pk] for pk in columns[0]])
    b = np.array([index[pk] for pk in columns[1]])
    score = np.array([ratings.VOTE_SCORES[choice] for choice in columns[2]])
    seen_a = np.array(columns[3:7], dtype=float).T  # length, headers, lists, bold of side A...
    seen_b = np.array(columns[7:11], dtype=float).T  # ...and of side B, as style.FEATURES orders them.
    return style.StyleOutcomes.from_arrays(len(names), a, b, score, style.differences(seen_a, seen_b))


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
