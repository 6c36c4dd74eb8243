"""A board's headline in plain words: who leads, by how much the votes can tell, and how sure
that is. No Django: rows as the snapshots store them (``rank``, ``model``, ``rating``,
``lower``, ``upper``, ``provisional``)."""

from collections.abc import Mapping, Sequence
from typing import Any


def _names(models: Sequence[str]) -> str:
    return models[0] if len(models) == 1 else ", ".join(models[:-1]) + " and " + models[-1]


def headline(rows: Sequence[Mapping[str, Any]], *, measure: str, evidence: str) -> str:
    """One sentence or two on the board's leader: ``measure`` names the rating ("rating",
    "fix-ability"), ``evidence`` what it rests on ("votes", "fix episodes")."""
    rows = [row for row in rows if row["rating"] is not None]  # Fix-ability: unrated, nothing to compare.
    if not rows:
        return ""
    leaders = [row for row in rows if row["rank"] == 1]
    first = max(leaders, key=lambda row: row["rating"])
    if first["lower"] is None or first["upper"] is None:  # Fix-ability: no fix, or no failure, observed.
        bound = f"at most {first['upper']:.0f}" if first["lower"] is None else f"at least {first['lower']:.0f}"
        interval = f"{first['rating']:.0f} (95% interval open-ended, {bound}: {first.get('open_ended')})"
    elif first["upper"] - first["lower"] < 1:
        # A bootstrap of a handful of votes can give them all alike: no width, not certainty.
        interval = f"{first['rating']:.0f} (too few {evidence} for an interval yet)"
    else:
        interval = f"{first['rating']:.0f} (95% interval {first['lower']:.0f} to {first['upper']:.0f})"
    if len(rows) == 1:
        text = f"Only {first['model']} is rated so far: its {measure} is {interval}."
    elif len(leaders) == 1:
        text = (
            f"{first['model']} leads with a {measure} of {interval}: the {evidence} so far put it clearly "
            "above every other model."
        )
    else:
        text = (
            f"{_names([row['model'] for row in leaders])} share first place: their intervals overlap, so the "
            f"{evidence} so far cannot tell them apart. The highest {measure} is {first['model']}'s, {interval}."
        )
    if first["provisional"]:
        text += f" {first['model']} is still provisional: too few {evidence} for its rank to be settled."
    return text
