"""How fast a reply's text may appear to the voter: one pace for both sides of a battle.
Plain Python.

Two anonymous models side by side give themselves away by speed: a small model streams faster
and starts sooner. The arena therefore shows both sides at the same pace: no text before
``first_after_s`` seconds from the reply's start, then at most ``chars_per_s`` characters a
second (characters, not tokens: tokenizers differ, what the voter sees does not). A model
faster than the pace is held back to it; only one slower than the pace would still show its
own speed. A pace chosen per battle would itself name the pair (paced at a slow model's speed,
a battle says that model is in it), so an anonymous battle is paced at what the slowest model
that anonymous battles may draw sustains (``battle_pace`` over all of them, from the models'
measured speeds on recent replies); only named and direct battles, whose names are known, take
their own pair's. Likewise the first text: on a turn sent to both sides the reply's start is when
*both* sides have their first text (``votes.generation.DeltaBatcher``), so that neither side's
first text comes sooner, and in an anonymous battle never sooner than ``first_text_lead`` after
the worker started on it: what the slowest drawable model typically takes to its first token,
so that a fast pair's first text waits as long as a slow pair's. 0 for both turns pacing off.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class Pace:
    chars_per_s: float = 0.0
    first_after_s: float = 0.0

    def __post_init__(self) -> None:
        if self.chars_per_s < 0 or self.first_after_s < 0:
            raise ValueError(f"A pace needs non-negative rates and delays, got {self}.")

    @property
    def active(self) -> bool:
        return self.chars_per_s > 0 or self.first_after_s > 0

    def visible(self, elapsed_s: float, available: int) -> int:
        """How many of ``available`` characters may be shown ``elapsed_s`` after the start.

        Times within a nanosecond count as reached: ``wait_s`` computes them by subtraction,
        and a clock that has advanced by exactly that much must see the text it waited for.
        """
        elapsed_s += _TOLERANCE_S
        if elapsed_s < self.first_after_s:
            return 0
        if self.chars_per_s <= 0:
            return available
        return min(available, int((elapsed_s - self.first_after_s) * self.chars_per_s) + 1)

    def wait_s(self, elapsed_s: float, shown: int) -> float:
        """Seconds from ``elapsed_s`` until more than ``shown`` characters may be shown."""
        if elapsed_s < self.first_after_s:
            return self.first_after_s - elapsed_s
        if self.chars_per_s <= 0:
            return 0.0
        return max(0.0, self.first_after_s + shown / self.chars_per_s - elapsed_s)


def sustained_speed(recent: Sequence[float]) -> float | None:
    """What a model sustains, from its own speeds (characters a second) on recent replies: their
    10th percentile, what nine replies in ten keep up with. Not the median: a pace that half the
    slowest model's replies cannot keep up with shows, on those replies, the model's own pauses
    (a probe named its side from the longest pause, 0.57 where chance is 0.5). None: no data."""
    if len(recent) < 2:
        return recent[0] if recent else None
    return statistics.quantiles(recent, n=10, method="inclusive")[0]


def battle_pace(configured: float, sustained: Sequence[float | None], *, unmeasured: float, margin: float) -> float:
    """Characters a second for every reply of a battle between models that sustain ``sustained``
    (None: not measured yet, taken as ``unmeasured``): ``margin`` times the slowest one, never
    above ``configured`` (the site's pace; 0 means pacing is off, and stays off). For an
    anonymous battle ``sustained`` is every model anonymous battles may draw, not the pair."""
    if configured <= 0:
        return 0.0
    speeds = [unmeasured if speed is None else margin * speed for speed in sustained]
    return max(1.0, min([configured, *speeds]))


def typical_first_token_s(recent_ms: Sequence[float]) -> float | None:
    """How long a model typically takes to its first token, from its own times (milliseconds) on
    recent replies: their 90th percentile, in seconds, so that the arena-wide delay covers nearly
    every reply of it, not half of them. None: no data."""
    if not recent_ms:
        return None
    if len(recent_ms) == 1:
        return recent_ms[0] / 1000
    return statistics.quantiles(recent_ms, n=10, method="inclusive")[8] / 1000


def first_text_lead(typical_s: Sequence[float | None], *, pacing: bool) -> float:
    """Seconds after its worker starts on it before an anonymous reply's pace may start: the
    longest typical time to first token (``typical_first_token_s``) of the models anonymous
    battles may draw (None: not measured yet, left out); 0 with pacing off."""
    return max([0.0, *(s for s in typical_s if s is not None)]) if pacing else 0.0
