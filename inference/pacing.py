"""How fast a reply's text may appear to the voter: one pace for every model. Plain Python.

Two anonymous models side by side give themselves away by speed: a small model streams faster
and starts sooner. The arena therefore shows every reply at the same pace: no text before
``first_after_s`` seconds from the reply's start, then at most ``chars_per_s`` characters a
second (characters, not tokens: tokenizers differ, what the voter sees does not). A model
faster than the pace is held back to it; only one slower than the pace still shows its own
speed, so the pace should be set below the slowest model's. 0 for both turns pacing off.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        """How many of ``available`` characters may be shown ``elapsed_s`` after the start."""
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
