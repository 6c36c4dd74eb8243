"""Automatic evaluation runs: the seed experiment's three measurements, without a human.

1. Reliability: the system prompt and the first scripted prompt, ``attempts`` times (each
   with its own sampling seed); every reply rated.
2. The complete dialog: every scripted prompt in order; whenever a reply is wrong, the checker's
   reason is sent as the correction, up to ``max_tries`` times per turn. A turn is ✓ when right
   at once, 🥦 when right after a correction, else 🍄 or 🔥 (its last verdict).
3. Fixing other models' mistakes: a dialog in which ANOTHER model erred (from part 2) is handed
   to the model with the correction; ``fix_attempts`` attempts, each rated 🥦 or 🍄 / 🔥.

Pure Python (no Django, no Keras): the caller passes a ``generate`` function and checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from votes.checkers import CheckResult

RELIABILITY, DIALOG, FIXING = "reliability", "dialog", "fixing"
CORRECT, MISTAKE, FIXED, GARBAGE = "correct", "mistake", "fixed", "garbage"
SYMBOLS = {CORRECT: "✓", MISTAKE: "🍄", FIXED: "🥦", GARBAGE: "🔥"}

Conversation = list[tuple[str, str]]  # (role, content), "user" or "assistant"
# generate(model, conversation, seed) -> reply text; the caller adds the task's system prompt.
Generate = Callable[[str, Conversation, int], str]


TOO_LONG = "the conversation no longer fits in the model's context"


class ContextOverflow(Exception):
    """Raised by ``generate`` when the conversation is longer than the model's context."""


@dataclass(frozen=True)
class ScriptedTurn:
    prompt: str
    check: Callable[[str], CheckResult]


@dataclass(frozen=True)
class Record:
    model: str
    part: str
    attempt: int
    turn: int
    try_number: int
    prompt: str
    reply: str
    verdict: str
    reason: str
    rating: str
    mistake_by: str | None = None


@dataclass(frozen=True)
class _Mistake:
    """A wrong first reply in a dialog: what came before it, and the reply itself."""

    model: str
    turn: int
    before: Conversation
    reply: str
    reason: str


def rating_for(result: CheckResult, *, after_correction: bool) -> str:
    if result.verdict == "correct":
        return FIXED if after_correction else CORRECT
    return GARBAGE if result.verdict == "garbage" else MISTAKE


def correction_for(result: CheckResult) -> str:
    """The checker's reason as one plain sentence a user would send."""
    reason = result.reason or "that is not right"
    return reason[0].upper() + reason[1:] + ("" if reason.endswith(".") else ".")


def steps(turns: Sequence[ScriptedTurn], attempts: int, fix_attempts: int) -> int:
    """Progress units per model: one per reliability attempt, dialog turn and fixing attempt."""
    return attempts + len(turns) + fix_attempts


def run(
    models: Sequence[str],
    turns: Sequence[ScriptedTurn],
    generate: Generate,
    *,
    attempts: int = 5,
    max_tries: int = 3,
    fix_attempts: int = 3,
    seed: int = 0,
    progress: Callable[[], None] = lambda: None,
) -> list[Record]:
    """All three measurements for every model; records in the order they were made."""
    if not turns:
        raise ValueError("The task has no scripted turns to evaluate.")
    records: list[Record] = []
    mistakes: list[_Mistake] = []
    seeds = iter(range(seed, seed + 10**9))
    overflow = CheckResult("garbage", (TOO_LONG,))

    def ask(model: str, conversation: Conversation, turn: ScriptedTurn) -> tuple[str, CheckResult]:
        """The reply and its check; a conversation too long for the model is garbage (🔥)."""
        try:
            reply = generate(model, conversation, next(seeds))
        except ContextOverflow:
            return "", overflow
        return reply, turn.check(reply)

    for model in models:
        first = turns[0]
        for attempt in range(attempts):
            reply, result = ask(model, [("user", first.prompt)], first)
            rating = rating_for(result, after_correction=False)
            records.append(
                Record(model, RELIABILITY, attempt, 0, 0, first.prompt, reply, result.verdict, result.reason, rating)
            )
            progress()

        conversation: Conversation = []
        overflowed = False
        for index, turn in enumerate(turns):
            conversation.append(("user", turn.prompt))
            prompt = turn.prompt
            for try_number in range(max_tries + 1):
                if overflowed:  # Later turns can't fit either: garbage, without asking.
                    reply, result = "", overflow
                else:
                    reply, result = ask(model, list(conversation), turn)
                    overflowed = result is overflow
                rating = rating_for(result, after_correction=try_number > 0)
                records.append(
                    Record(model, DIALOG, 0, index, try_number, prompt, reply, result.verdict, result.reason, rating)
                )
                if overflowed:
                    break
                if try_number == 0 and result.verdict != "correct":
                    mistakes.append(_Mistake(model, index, list(conversation), reply, result.reason))
                conversation.append(("assistant", reply))
                if result.verdict == "correct" or try_number == max_tries:
                    break
                prompt = correction_for(result)
                conversation.append(("user", prompt))
            progress()

    for model in models:
        others = [m for m in mistakes if m.model != model]
        for attempt in range(fix_attempts):
            if not others:
                progress()
                continue
            mistake = others[attempt % len(others)]
            correction = correction_for(CheckResult("mistake", (mistake.reason,)))
            conversation = [*mistake.before, ("assistant", mistake.reply), ("user", correction)]
            reply, result = ask(model, conversation, turns[mistake.turn])
            rating = rating_for(result, after_correction=True)
            records.append(
                Record(
                    model,
                    FIXING,
                    attempt,
                    mistake.turn,
                    1,
                    correction,
                    reply,
                    result.verdict,
                    result.reason,
                    rating,
                    mistake_by=mistake.model,
                )
            )
            progress()
    return records


def turn_ratings(records: Sequence[Record]) -> dict[tuple[str, int], str]:
    """The dialog's rating per (model, turn): that of the turn's last reply."""
    final: dict[tuple[str, int], str] = {}
    for record in records:
        if record.part == DIALOG:
            final[(record.model, record.turn)] = record.rating
    return final


def recap(records: Sequence[Record]) -> list[tuple[str, dict[str, int]]]:
    """Models ranked by their tally, as in the seed write-up: most ✓ + 🥦 first, then fewest 🔥.

    Counted: every reliability reply, each dialog turn once (its final rating), every fixing
    attempt.
    """
    tallies: dict[str, dict[str, int]] = {}
    counted = [(r.model, r.rating) for r in records if r.part != DIALOG]
    counted += [(model, rating) for (model, _), rating in turn_ratings(records).items()]
    for model, rating in counted:
        tally = tallies.setdefault(model, {CORRECT: 0, FIXED: 0, MISTAKE: 0, GARBAGE: 0})
        tally[rating] += 1
    return sorted(
        tallies.items(),
        key=lambda item: (-(item[1][CORRECT] + item[1][FIXED]), item[1][GARBAGE], -item[1][CORRECT], item[0]),
    )
