"""The research API's leaderboard (mounted by arena_site.api at /api/v1/leaderboard)."""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema
from ninja.errors import HttpError

from arena_site.api_common import ERRORS, Error
from leaderboard import selectors as leaderboard_selectors
from leaderboard import wording

router = Router()


class LeaderboardRow(Schema):
    """A model's row: vote boards give votes, Elo and fix rates; the fix-ability board
    ("fixing") gives episodes, fixed, the raw fix rate with its Wilson interval, the share of the
    model's judged replies judged wrong, and ``open_ended``: why a bound is null (no fix, or no
    failure, observed: that side is open) or the rating is (no episode to compare)."""

    model: str
    rating: float | None = Field(
        description="On an open-ended vote-board interval: its finite bound (what the votes support). "
        "Null: fix-ability with no episode to compare (unrated)."
    )
    lower: float | None = Field(description="Null: open-ended, no lower bound (lower_open; bound_note says why).")
    upper: float | None = Field(description="Null: open-ended, no upper bound (upper_open; bound_note says why).")
    rank: int | None = Field(
        description="1 + the models of its group whose interval lies wholly above this one's. Null: unrated."
    )
    provisional: bool
    group: int = Field(1, description="Comparison group (1: the largest); models of different groups never met.")
    lower_open: bool = Field(False, description="No lower bound: the model never won a vote (or never beat the rest).")
    upper_open: bool = Field(False, description="No upper bound: the model is unbeaten (or never beaten by the rest).")
    bound_note: str = Field("", description="Why an interval is open, in words (e.g. 'unbeaten').")
    votes: int | None = None
    elo: float | None = None
    fix_rate: dict[str, Any] | float | None = None
    checker_fix_rate: dict[str, Any] | None = None
    swap_votes: int | None = Field(
        None,
        description="Vote boards: the number of votes whose removal would swap this model with the next one down "
        "(0: level in rating; null for the last row and on the fix-ability and style-controlled rows). Found by "
        "removing the most influential votes first and refitting: an upper bound of the fewest.",
    )
    episodes: int | None = None
    fixed: int | None = None
    fix_lower: float | None = None
    fix_upper: float | None = None
    open_ended: str | None = Field(default=None, description='Fix-ability: "no fix observed", ... ; empty: closed.')
    wrong_rate: dict[str, Any] | None = Field(
        default=None,
        description="Fix-ability: judged first tries (replies to a prompt both sides got) judged wrong "
        "{wrong, judged, rate, lower, upper}.",
    )


class Leaderboard(Schema):
    refresh_id: int
    refreshed: datetime
    category: str
    title: str
    method: str
    votes: int
    excluded: dict[str, int]
    rows: list[LeaderboardRow]
    style_control: bool = Field(description="Whether rows are the style-controlled ratings (overall, ?style=true).")
    style_coefficients: dict[str, dict[str, float]] = Field(
        description="With style control: each style coefficient {value, lower, upper}, log-odds per unit of difference."
    )
    unrated: list[str] = Field(description="Models without a vote in this category: not yet rated, not ranked.")
    groups: list[dict[str, Any]] = Field(
        description="With models in several comparison groups: per group {group, models, reason}; else empty."
    )
    categories: list[str]


@router.get("", response={200: Leaderboard, 404: Error, **ERRORS}, tags=["leaderboard"])
def leaderboard(
    request: HttpRequest, category: str = "overall", refresh: int | None = None, style: bool = False
) -> Any:
    """The latest leaderboard of a category, or the one of an earlier refresh (``refresh``);
    ``style``: the overall board with style control (ratings at equal length and markdown, and
    the style coefficients)."""
    found = leaderboard_selectors.refresh_by_id(refresh) if refresh else leaderboard_selectors.latest_refresh()
    if found is None:
        raise HttpError(404, "No such leaderboard refresh." if refresh else "No leaderboard has been computed yet.")
    snapshots = {snapshot.category: snapshot for snapshot in found.snapshots.all()}
    snapshot = snapshots.get(category)
    if snapshot is None:
        raise HttpError(404, f"No category {category!r}; known: {', '.join(snapshots)}.")
    rows = snapshot.style_rows if style and snapshot.style_rows else snapshot.rows
    return {
        "refresh_id": found.pk,
        "refreshed": found.created,
        "category": category,
        "title": snapshot.title,
        "method": snapshot.method,
        "votes": snapshot.votes,
        "excluded": snapshot.excluded,
        "rows": rows,
        "groups": wording.group_notes(rows),
        "style_control": bool(style and snapshot.style_rows),
        "style_coefficients": snapshot.style_coefficients if style else {},
        "unrated": snapshot.unrated,
        "categories": list(snapshots),
    }
