"""Template filters of the leaderboard page."""

from collections.abc import Mapping
from typing import Any

from django import template

register = template.Library()


@register.filter
def interval(row: Mapping[str, Any]) -> str:
    """A row's 95% interval, "lower – upper"; with too little evidence the bootstrap rounds can
    all agree and give it no width, which is not certainty: said so instead. A bound the data
    cannot give (fix-ability of a model with no fix, or no failure) is None: open-ended, and why."""
    lower, upper = row["lower"], row["upper"]
    note = row.get("open_ended") or "no bound from the data"
    if lower is None and upper is None:
        return f"unrated: {note}"
    if lower is None:
        return f"below {upper:.1f} (open-ended: {note})"
    if upper is None:
        return f"above {lower:.1f} (open-ended: {note})"
    if upper - lower < 0.05:
        return "too few to tell"
    return f"{lower:.1f} – {upper:.1f}"
