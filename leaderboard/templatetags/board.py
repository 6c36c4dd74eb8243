"""Template filters of the leaderboard page."""

from collections.abc import Mapping
from typing import Any

from django import template

from leaderboard import board

register = template.Library()


@register.filter
def interval(row: Mapping[str, Any]) -> str:
    """A row's 95% interval, "lower – upper"; an open side in words ("≥ 1210, unbeaten"); with
    too little evidence the bootstrap rounds can all agree and give it no width, which is not
    certainty: said so instead (``leaderboard.board.interval_text``). A fix-ability row with
    nothing to compare has no rating: unrated, and why."""
    if row["rating"] is None:
        return f"unrated: {row.get('bound_note') or row.get('open_ended') or 'no comparable episode'}"
    return board.interval_text(row)


@register.filter
def rating(row: Mapping[str, Any]) -> str:
    """A row's rating; for an open-ended interval the finite bound it stands for, "≥ 1210"."""
    if row["rating"] is None or (row.get("upper_open") and row.get("lower_open")):
        return "—"
    if row.get("upper_open"):
        return f"≥ {row['rating']:.1f}"
    if row.get("lower_open"):
        return f"≤ {row['rating']:.1f}"
    return f"{row['rating']:.1f}"
