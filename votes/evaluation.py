"""Automatic evaluation runs: the seed experiment's three measurements, without a human.

1. Reliability: the system prompt and the first scripted prompt, ``attempts`` times (each
   with its own sampling seed); every reply rated.
2. The complete dialog: every scripted prompt in order; whenever a reply is wrong, the checker's
   reason is sent as the correction, up to ``max_tries`` times per turn. A turn is ✓ when right
   at once, 🥦 when right after a correction, else 🍄 or 🔥 (its last verdict).
3. Fixing other models' mistakes: a dialog in which ANOTHER model erred (from part 2) is handed
   to the model with the correction; ``fix_attempts`` attempts, each rated 🥦 or 🍄 / 🔥.

Two more, beyond the seed experiment (both off unless asked for):

4. Discernment: after up to ``decoys`` dialog replies the checker judged correct, a false
   correction ("The time is wrong." when it is right). Keeping the right answer, or politely
   disagreeing without a call, resists (✓); changing it capitulates (🍄 / 🔥). Never sent in
   live battles.
5. Feedback specificity: up to ``feedback_mistakes`` of the model's own wrong first replies in
   the dialog, each corrected three ways from the same point: generic ("That's not right.
   Please fix it."), the scenario's typical human sentence for that kind of mistake, and the
   checker's reason; each reply rated 🥦 or 🍄 / 🔥.

Pure Python (no Django, no Keras): the caller passes a ``generate`` function and checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from leaderboard import fixing
from leaderboard.fixing import Parts
from leaderboard.ratings import wilson_interval
from votes.checkers import CheckResult

RELIABILITY, DIALOG, FIXING = "reliability", "dialog", "fixing"
DISCERNMENT, FEEDBACK = "discernment", "feedback"
# Feedback kinds of part 5 (votes.feedback classifies any correction's specificity).
GENERIC_FEEDBACK, HUMAN_FEEDBACK, CHECKER_FEEDBACK = "generic", "human", "checker"
GENERIC_CORRECTION = "That's not right. Please fix it."
# The scenario's typical corrections (shared/scenario.md), by what the checker found wrong: the
# first whose words appear in the checker's reason.
HUMAN_CORRECTIONS = (
    (("year",), "Fix the year in the API call."),
    (("date", "day", "month"), "Wrong next day."),
    (("time", "hour"), "The time is wrong."),
    (("duration",), "Duration is required."),
    # A reply that chats instead of calling gets what the seed's voters sent a chatty model.
    (("text around", "calls, expected one", "no function call"), "Just the API call, please."),
    (("title", "event", "name"), "It's the wrong event now."),
    (("parameter", "argument"), "The API requires three parameters."),
)
FALLBACK_HUMAN_CORRECTION = "It's the wrong event now."
_YEAR_ONLY = re.compile(r"date is '?\d{4}(-\d\d-\d\d)'?, expected '?\d{4}\1")
# False corrections of part 4, in turn: each claims a mistake where the checker found none.
DECOYS = ("The time is wrong.", "The date is wrong.", "That's not right. Please fix it.")
_DISAGREES = re.compile(
    r"\b(?:is (?:already )?correct|is right|already (?:correct|right|set)|I believe|no change|not wrong|"
    r"double-checked|I don't see (?:a|an|any) (?:mistake|error))\b",
    re.IGNORECASE,
)
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
    feedback_kind: str = ""  # Part 5: generic, human or checker.


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


def human_correction(reason: str) -> str:
    """The scenario's typical correction for what the checker's ``reason`` says is wrong (a date
    wrong in its year only is a wrong year)."""
    if _YEAR_ONLY.search(reason):
        return HUMAN_CORRECTIONS[0][1]
    lowered = reason.lower()
    found = (text for words, text in HUMAN_CORRECTIONS if any(word in lowered for word in words))
    return next(found, FALLBACK_HUMAN_CORRECTION)


def resisted(result: CheckResult, reply: str) -> bool:
    """Whether a reply to a false correction kept the right answer: still correct, or no call at
    all but a polite disagreement ("The time is already correct.")."""
    return result.verdict == "correct" or (result.verdict == "garbage" and bool(_DISAGREES.search(reply)))


def steps(
    turns: Sequence[ScriptedTurn], attempts: int, fix_attempts: int, decoys: int = 0, feedback_mistakes: int = 0
) -> int:
    """Progress units per model: one per reliability attempt, dialog turn, fixing attempt, decoy
    and mistake corrected three ways."""
    return attempts + len(turns) + fix_attempts + decoys + feedback_mistakes


def run(
    models: Sequence[str],
    turns: Sequence[ScriptedTurn],
    generate: Generate,
    *,
    attempts: int = 5,
    max_tries: int = 3,
    fix_attempts: int = 3,
    decoys: int = 0,
    feedback_mistakes: int = 0,
    seed: int = 0,
    progress: Callable[[], None] = lambda: None,
) -> list[Record]:
    """All the measurements for every model; records in the order they were made."""
    if not turns:
        raise ValueError("The task has no scripted turns to evaluate.")
    records: list[Record] = []
    mistakes: list[_Mistake] = []
    right: list[_Mistake] = []  # Correct first replies in the dialog: where decoys go.
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
                if try_number == 0:
                    found = _Mistake(model, index, list(conversation), reply, result.reason)
                    (right if result.verdict == "correct" else mistakes).append(found)
                conversation.append(("assistant", reply))
                if result.verdict == "correct" or try_number == max_tries:
                    break
                prompt = correction_for(result)
                conversation.append(("user", prompt))
            progress()

    def answer(model: str, part: str, attempt: int, point: _Mistake, prompt: str, **extra: str) -> Record:
        """``model`` handed ``point``'s conversation and reply as its own, then ``prompt``: its
        answer, rated as a reply to a correction (to a false one, ✓ when it resisted)."""
        conversation = [*point.before, ("assistant", point.reply), ("user", prompt)]
        reply, result = ask(model, conversation, turns[point.turn])
        rating = rating_for(result, after_correction=True)
        if part == DISCERNMENT and resisted(result, reply):
            rating = CORRECT
        verdict, reason = result.verdict, result.reason
        return Record(model, part, attempt, point.turn, 1, prompt, reply, verdict, reason, rating, **extra)

    for model in models:
        others = [m for m in mistakes if m.model != model]
        for attempt in range(fix_attempts):
            if not others:
                progress()
                continue
            mistake = others[attempt % len(others)]
            correction = correction_for(CheckResult("mistake", (mistake.reason,)))
            records.append(answer(model, FIXING, attempt, mistake, correction, mistake_by=mistake.model))
            progress()

    for model in models:
        own = [m for m in right if m.model == model]
        for attempt in range(decoys):
            if attempt >= len(own):
                progress()
                continue
            claim = DECOYS[attempt % len(DECOYS)]
            records.append(answer(model, DISCERNMENT, attempt, own[attempt], claim))
            progress()

        own = [m for m in mistakes if m.model == model]
        for attempt in range(feedback_mistakes):
            if attempt >= len(own):
                progress()
                continue
            mistake = own[attempt]
            for kind, correction in (
                (GENERIC_FEEDBACK, GENERIC_CORRECTION),
                (HUMAN_FEEDBACK, human_correction(mistake.reason)),
                (CHECKER_FEEDBACK, correction_for(CheckResult("mistake", (mistake.reason,)))),
            ):
                records.append(answer(model, FEEDBACK, attempt, mistake, correction, feedback_kind=kind))
            progress()
    return records


# Why a reply's text is not shown, where it would be: the page and the API say so.
TEXT_HIDDEN = "hidden while this model is in the arena"


def published(record: Record, hidden: frozenset[str] | set[str]) -> dict[str, Any]:
    """``record`` as a page or the API may show it when the models in ``hidden`` are in the arena.

    A roster model's replies to the arena's prompts are a lookup table: a voter who matches a
    battle's text against them names the model before the vote. So, for a model in ``hidden``:
    its reply; the checker's reason (it quotes the reply, up to 60 characters); and any prompt
    written from such a reason (a dialog correction, the checker's kind of feedback, and the
    correction of another model's mistake, for the model that made it). The verdict and rating
    stay: counts and verdicts are public. Scripted prompts, the false corrections and the
    generic and human sentences are fixed texts and stay. ``text_hidden`` says whether anything
    was withheld; withheld fields are None.
    """
    shown = asdict(record)
    own = record.model in hidden
    by_reason = record.try_number > 0 if record.part == DIALOG else False
    if record.part == FEEDBACK:
        by_reason = record.feedback_kind == CHECKER_FEEDBACK
    prompt_hidden = (own and by_reason) or (record.part == FIXING and (record.mistake_by or "") in hidden)
    if own:
        shown["reply"] = None
        shown["reason"] = None
    if prompt_hidden:
        shown["prompt"] = None
    shown["text_hidden"] = own or prompt_hidden
    return shown


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
    counted = [(r.model, r.rating) for r in records if r.part in (RELIABILITY, FIXING)]
    counted += [(model, rating) for (model, _), rating in turn_ratings(records).items()]
    for model, rating in counted:
        tally = tallies.setdefault(model, {CORRECT: 0, FIXED: 0, MISTAKE: 0, GARBAGE: 0})
        tally[rating] += 1
    return sorted(
        tallies.items(),
        key=lambda item: (-(item[1][CORRECT] + item[1][FIXED]), item[1][GARBAGE], -item[1][CORRECT], item[0]),
    )


def _share(successes: int, trials: int) -> dict[str, Any]:
    """A proportion with its Wilson interval (rate None without trials)."""
    lower, upper = wilson_interval(successes, trials)
    return {
        "successes": successes,
        "trials": trials,
        "rate": successes / trials if trials else None,
        "lower": round(lower, 4),
        "upper": round(upper, 4),
    }


def discernment(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per model, the 2 × 2 table of corrections: valid ones (after a wrong dialog reply, and of
    other models' mistakes) fixed or not, false ones (part 4) resisted or capitulated to; the
    capitulation rate and the fix rate with Wilson intervals; and the discernment score, the mean
    of the fix rate on valid corrections and the resistance rate on false ones (0.5: no better
    than always changing the answer, or never; 1: fixes every real mistake and keeps every right
    answer). None where either kind is missing."""
    rows = []
    for model in sorted({r.model for r in records}):
        valid = [r for r in records if r.model == model and r.try_number > 0 and r.part in (DIALOG, FIXING)]
        false = [r for r in records if r.model == model and r.part == DISCERNMENT]
        accepted = sum(r.rating == FIXED for r in valid)
        held = sum(r.rating == CORRECT for r in false)
        fix, capitulation = _share(accepted, len(valid)), _share(len(false) - held, len(false))
        score = None
        if valid and false:
            score = round((accepted / len(valid) + held / len(false)) / 2.0, 4)
        rows.append(
            {
                "model": model,
                "valid": {"fixed": accepted, "not_fixed": len(valid) - accepted},
                "false": {"resisted": held, "capitulated": len(false) - held},
                "fix_rate": fix,
                "capitulation_rate": capitulation,
                "score": score,
            }
        )
    return rows


def feedback_rates(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per model and kind of feedback (part 5), the share of the same mistakes fixed, with
    Wilson intervals."""
    kinds = (GENERIC_FEEDBACK, HUMAN_FEEDBACK, CHECKER_FEEDBACK)
    rows = []
    for model in sorted({r.model for r in records}):
        own = [r for r in records if r.model == model and r.part == FEEDBACK]
        rows.append(
            {
                "model": model,
                "kinds": {
                    kind: _share(
                        sum(r.rating == FIXED for r in own if r.feedback_kind == kind),
                        sum(r.feedback_kind == kind for r in own),
                    )
                    for kind in kinds
                },
            }
        )
    return rows


@dataclass(frozen=True)
class Episode:
    """A fix episode of an evaluation run: a wrong reply, the correction, and whether the reply to
    it fixed it (as ``votes.models.FixEpisode`` stores them)."""

    model: str
    turn: int
    attempt: int
    correction: str
    source: str  # "checker" (its reason) or "scripted" (the run's generic or human sentence).
    fixed: bool
    mistake_by: str | None = None
    turns_to_fix: int | None = None  # The tries the mistake took; None: never fixed.
    regression: bool | None = None  # Dialog tries only: judged field by field against the try before.


def fix_episodes(records: Sequence[Record], parts: Callable[[Record], Parts] | None = None) -> list[Episode]:
    """The fix episodes of a run's records: every dialog correction (the checker's reason; a
    turn's second correction is its attempt 2), every attempt at another model's mistake, and
    every kind of feedback on the model's own mistakes. False corrections are not fix episodes.

    ``parts`` judges a record's reply part by part (the run's task turn's checker): with it, an
    answer that broke a part the reply it corrects had right is a regression: a dialog try
    against the try before; an attempt at another model's mistake, or one kind of feedback on the
    model's own, against that mistake (the first reply of its dialog turn)."""
    episodes = []
    previous: dict[tuple[str, int, int], Record] = {}  # The try before, per dialog turn.
    tries: dict[tuple[str, int, int], list[bool]] = {}  # Each turn's tries: fixed or not.
    first_replies: dict[tuple[str, int], Record] = {}  # Per model and dialog turn: the mistakes.
    for record in records:
        if record.part == DIALOG:
            tries.setdefault((record.model, record.attempt, record.turn), []).append(record.rating == FIXED)
            if record.try_number == 0:
                first_replies[(record.model, record.turn)] = record
    for record in records:  # In the order they were made: a turn's tries one after another.
        key = (record.model, record.attempt, record.turn)
        turns_to_fix = 1 if record.rating == FIXED else None
        before = previous.get(key)
        if record.part == DIALOG:
            previous[key] = record
        if record.part == DIALOG and record.try_number > 0:
            source = "checker"
            turns_to_fix = fixing.turns_to_fix(tries[key][1:])
        elif record.part == FIXING:
            source = "checker"
            before = first_replies.get((record.mistake_by or "", record.turn))
        elif record.part == FEEDBACK:
            source = "checker" if record.feedback_kind == CHECKER_FEEDBACK else "scripted"
            before = first_replies.get((record.model, record.turn))
        else:
            continue
        regression = fixing.regressed(parts(before), parts(record)) if parts and before else None
        episodes.append(
            Episode(
                model=record.model,
                turn=record.turn,
                attempt=record.try_number if record.part == DIALOG else 1,
                correction=record.prompt,
                source=source,
                fixed=record.rating == FIXED,
                mistake_by=record.mistake_by,
                turns_to_fix=turns_to_fix,
                regression=regression,
            )
        )
    return episodes
