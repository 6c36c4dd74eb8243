"""Template filters of the leaderboard page."""

from collections.abc import Mapping
from typing import Any

from django import template

register = template.Library()


@register.filter
def interval(row: Mapping[str, Any]) -> str:
    """A row's 95% interval, "lower – upper"; with too little evidence the bootstrap rounds can
    all agree and give it no width, which is not certainty: said so instead."""
    lower, upper = row["lower"], row["upper"]
    if upper - lower < 0.05:
        return "too few to tell"
    return f"{lower:.1f} – {upper:.1f}"
