"""A board's headline in plain words: who leads, by how much the votes can tell, and how sure
that is. No Django: rows as the snapshots store them (``rank``, ``model``, ``rating``,
``lower``, ``upper``, ``provisional``; on vote boards also ``group``, ``lower_open``,
``upper_open``, ``bound_note``)."""

from collections.abc import Mapping, Sequence
from typing import Any


def _names(models: Sequence[str]) -> str:
    return models[0] if len(models) == 1 else ", ".join(models[:-1]) + " and " + models[-1]


def _interval(row: Mapping[str, Any], evidence: str) -> str:
    note = row.get("bound_note") or ""
    if row.get("upper_open") and row.get("lower_open"):
        return f"not bounded by the {evidence} so far ({note})" if note else f"not bounded by the {evidence} so far"
    if row.get("upper_open"):
        return f"at least {row['lower']:.0f} ({note}: the {evidence} so far put no upper bound on it)"
    if row.get("lower_open"):
        return f"at most {row['upper']:.0f} ({note}: the {evidence} so far put no lower bound on it)"
    if row["upper"] - row["lower"] < 1:
        # A bootstrap of a handful of votes can give them all alike: no width, not certainty.
        return f"{row['rating']:.0f} (too few {evidence} for an interval yet)"
    return f"{row['rating']:.0f} (95% interval {row['lower']:.0f} to {row['upper']:.0f})"


def group_notes(rows: Sequence[Mapping[str, Any]], *, fixing: bool = False) -> list[dict[str, Any]]:
    """The board's comparison groups when it has more than one: per group, its models and why
    it stands apart (``fixing``: the fix-ability board's, whose models are compared through the
    prompts their corrections share). Empty when every model is in one group."""
    groups = sorted({row.get("group", 1) for row in rows})
    if len(groups) < 2:
        return []
    notes = []
    for group in groups:
        models = [row["model"] for row in rows if row.get("group", 1) == group]
        others = ", ".join(str(g) for g in groups if g != group)
        notes.append(
            {
                "group": group,
                "models": models,
                "reason": (
                    f"These models were never corrected on a prompt that a model of group"
                    f"{'s' if len(groups) > 2 else ''} {others} was, directly or through other models, so no "
                    "fix episode compares them: their fix-abilities are on a scale of their own (averaging 1000 "
                    "within the group) and they are not ranked against the other groups."
                    if fixing
                    else f"These models never met a model of group{'s' if len(groups) > 2 else ''} {others}, "
                    "directly or through other models, so no vote compares them: their ratings are on a scale of "
                    "their own (averaging 1000 within the group) and they are not ranked against the other groups."
                ),
            }
        )
    return notes


def headline(rows: Sequence[Mapping[str, Any]], *, measure: str, evidence: str) -> str:
    """One sentence or two on the board's leader: ``measure`` names the rating ("rating",
    "fix-ability"), ``evidence`` what it rests on ("votes", "fix episodes"). Rows come best
    first; with several comparison groups, the headline is about the first (the largest)."""
    rows = [row for row in rows if row["rating"] is not None]  # Fix-ability: unrated, nothing to compare.
    if not rows:
        return ""
    group = rows[0].get("group", 1)
    in_group = [row for row in rows if row.get("group", 1) == group]
    leaders = [row for row in in_group if row["rank"] == 1]
    settled = [row for row in leaders if not row.get("upper_open") and not row.get("lower_open")]
    first = max(settled, key=lambda row: row["rating"]) if settled else leaders[0]
    interval = _interval(first, evidence)
    if len(rows) == 1:
        text = f"Only {first['model']} is rated so far: its {measure} is {interval}."
    elif len(in_group) == 1:
        text = f"{first['model']}'s {measure} is {interval}."
    elif len(leaders) == 1:
        text = (
            f"{first['model']} leads with a {measure} of {interval}: the {evidence} so far put it clearly "
            "above every other model" + (" of its group." if len(in_group) < len(rows) else ".")
        )
    else:
        text = (
            f"{_names([row['model'] for row in leaders])} share first place: their intervals overlap, so the "
            f"{evidence} so far cannot tell them apart. The "
            + (f"highest {measure} is {first['model']}'s," if settled else f"first listed, {first['model']}, is")
            + f" {interval}."
        )
    groups = len({row.get("group", 1) for row in rows})
    if groups > 1:
        text += (
            f" The models fall into {groups} groups that never met, each ranked on its own: no vote says which "
            "group is better."
        )
    if first.get("provisional"):
        text += f" {first['model']} is still provisional: too few {evidence} for its rank to be settled."
    return text
