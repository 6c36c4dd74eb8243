"""How specific a correction is: generic, pointing at the error, or prescribing the fix. No Django.

Research on self-correction compares the gain from feedback of different precision (FeedbackEval;
seed 003). A rule-based classifier is enough for the short sentences voters send:

* **prescriptive** — it gives the right value: a number, a date or time, something quoted, or
  wording such as "should be", "instead of", "use …" ("The current year is 2024.", "Time in 24h
  format.", "Use the default duration.");
* **pointing** — it names what is wrong without giving the value ("The time is wrong.", "Fix the
  year in the API call.", "Extra parenthesis.");
* **generic** — neither ("That's not right. Please fix it.", "Try again.").
"""

from __future__ import annotations

import re

GENERIC, POINTING, PRESCRIPTIVE = "generic", "pointing", "prescriptive"
KINDS = (GENERIC, POINTING, PRESCRIPTIVE)

# A value: a digit, something quoted, a clock time, or a unit spelled out with a number word.
_VALUE = re.compile(r"\d|[\"'`“”‘’][^\"'`“”‘’]+[\"'`“”‘’]|\b(?:one|two|three|four|five|six|half)\b", re.IGNORECASE)
_PRESCRIBING = re.compile(
    r"\b(?:should be|should have been|must be|needs? to be|instead of|rather than|use|set|make it|"
    r"change (?:it|that|this) to|replace|it'?s (?:actually|really)|the (?:correct|right)\b|only|just)\b",
    re.IGNORECASE,
)
# What a calendar call (or most small tasks) can get wrong, by name.
_ASPECTS = re.compile(
    r"\b(?:year|date|day|month|week|time|hour|minute|duration|title|name|event|meeting|"
    r"format|parameters?|arguments?|api|call|function|parenthes[ie]s|quotes?|spelling|typo|"
    r"info(?:rmation)?|chatter|text|explanation|code|syntax|units?|sum|total|number|answer\s+to)\b",
    re.IGNORECASE,
)
_ERROR_WORDS = re.compile(
    r"\b(?:wrong|incorrect|missing|extra|required|not needed|don'?t need|no need|mistake|error|fix|"
    r"invalid|off|respect|forgot|too (?:early|late|long|short))\b",
    re.IGNORECASE,
)


def specificity(correction: str) -> str:
    """The correction's class: ``GENERIC``, ``POINTING`` or ``PRESCRIPTIVE``."""
    text = correction.strip()
    if _VALUE.search(text) or (_PRESCRIBING.search(text) and _ASPECTS.search(text)):
        return PRESCRIPTIVE
    if _ASPECTS.search(text) and (_ERROR_WORDS.search(text) or len(text.split()) <= 4):
        return POINTING
    return GENERIC
