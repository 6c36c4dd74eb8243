"""A simulated voter who judges as a task's checker does (manage.py bench_fixing_board): plain
asyncio, no Django.

It plays a task battle the way a careful voter plays the calendar dialog on the page: it sends
the task's scripted prompts in order to both sides, judges every reply with the turn's own
checker (``votes.checkers``, the verdicts the server also records), rates it (✓, 🍄, 🥦 or 🔥),
votes on the first try before any correction, and whenever a side's reply is wrong tells that
side alone what is wrong, in one sentence, while the other side waits, up to
``max_corrections`` times; then it votes after the fix and goes on with the next scripted
prompt. The fix episodes the server derives from these battles are what the live "Fixing
mistakes" board rates.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from votes import checkers, evaluation
from votes.testing.voters import ErrorFrame, ReplyRecord, Voter

FEEDBACK_KINDS = (evaluation.CHECKER_FEEDBACK, evaluation.HUMAN_FEEDBACK, evaluation.GENERIC_FEEDBACK)
NO_CHECK = "none"
# The error codes of a prompt past the arena's limits (ARENA_MAX_CONVERSATION_BYTES, the battle's
# turns), and of a battle the arena closed because a reply named a model after the vote: the
# voter ends the battle there, as the arena asks.
AT_LIMIT = ("conversation_too_long", "too_many_turns")
CLOSED = "named_after_vote"


@dataclass(frozen=True)
class ScriptedTurn:
    """One of the task's turns as its battles keep it (``TaskTurn.as_script``)."""

    prompt: str
    expected_output: str
    checker: str
    checker_options: Mapping[str, Any]
    corrects_previous: bool = False

    @classmethod
    def from_script(cls, turn: Mapping[str, Any]) -> ScriptedTurn:
        return cls(
            prompt=turn["prompt"],
            expected_output=turn["expected_output"],
            checker=turn["checker"],
            checker_options=turn.get("checker_options") or {},
            corrects_previous=bool(turn.get("corrects_previous")),
        )

    def check(self, reply: str) -> checkers.CheckResult | None:
        if self.checker == NO_CHECK:
            return None
        return checkers.check(self.checker, self.expected_output, reply, self.checker_options)


@dataclass
class Judged:
    """What the voter saw of one side's reply."""

    side: str
    turn: int
    script_turn: int
    verdict: str
    rating: str
    correction: bool  # It answered a correction (the server's "corrects" for its prompt).


@dataclass
class CheckerVoterLog:
    judged: list[Judged] = field(default_factory=list)
    corrections: int = 0
    cut_at_limit: bool = False  # The battle reached the arena's length or turn limit before the script's end.
    closed: bool = False  # The arena closed the battle: a reply named a model after the vote.


def correction_text(result: checkers.CheckResult, kind: str) -> str:
    """The one sentence the voter sends a wrong side: the checker's reason, the scenario's human
    sentence for that kind of mistake, or the generic one (``votes.evaluation``'s three)."""
    if kind == evaluation.GENERIC_FEEDBACK:
        return evaluation.GENERIC_CORRECTION
    if kind == evaluation.HUMAN_FEEDBACK:
        return evaluation.human_correction(result.reason or "")
    return evaluation.correction_for(result)


def vote_choice(wrong: Mapping[str, bool]) -> str:
    """The voter's vote from the two sides' current replies: the right one, a tie if both are
    right, both bad if neither is."""
    if wrong["a"] == wrong["b"]:
        return "both_bad" if wrong["a"] else "tie"
    return "b" if wrong["a"] else "a"


class CheckerVoter(Voter):
    # The bench measures the board, not the wait: a reply may wait for its model's first
    # compilation of a longer conversation's shape, behind a busy engine, far longer than a
    # load test allows.
    frame_timeout_s = 900.0

    def __init__(
        self,
        base_url: str,
        index: int,
        rng: random.Random,
        *,
        task: str,
        script: Sequence[ScriptedTurn],
        turns: int | None = None,
        max_corrections: int = 1,
        feedback_kinds: Sequence[str] = FEEDBACK_KINDS,
    ) -> None:
        super().__init__(base_url, index, rng)
        if not script:
            raise ValueError("A checker voter needs a task with scripted turns.")
        unknown = set(feedback_kinds) - set(FEEDBACK_KINDS)
        if unknown or not feedback_kinds:
            raise ValueError(f"Feedback kinds are some of {', '.join(FEEDBACK_KINDS)}; got {sorted(unknown)}.")
        self.task = task
        self.script = list(script[:turns] if turns else script)
        self.max_corrections = max_corrections
        self.feedback_kinds = list(feedback_kinds)
        self.log = CheckerVoterLog()
        self.wrong = {"a": False, "b": False}  # Each side's latest reply judged wrong.
        self.voted: set[str] = set()
        self.reasons: dict[str, checkers.CheckResult] = {}  # Why each side's latest wrong reply is wrong.

    async def battle(self) -> None:
        self.step = f"starting a battle on {self.task}"
        await self.send({"type": "start", "task": self.task})
        await self.read_until(lambda frame: frame["type"] == "state")
        try:
            for position, scripted in enumerate(self.script):
                await self.play_turn(position, scripted)
        except ErrorFrame as error:
            if error.code not in (*AT_LIMIT, CLOSED):
                raise
            self.log.cut_at_limit = error.code in AT_LIMIT
            self.log.closed = error.code == CLOSED
        self.step = "ending the battle"
        await self.send({"type": "end"})
        revealed = (await self.read_until(lambda frame: frame["type"] == "revealed"))[-1]
        self.result.models = dict(revealed.get("models") or {})

    async def play_turn(self, position: int, scripted: ScriptedTurn) -> None:
        """One scripted prompt to both sides, the first-try vote after the first, then each wrong
        side corrected alone, and the after-fix vote after the first correction."""
        await self.ask(scripted.prompt, position, scripted, sides=("a", "b"))
        if "first_try" not in self.voted:
            await self.cast("first_try")
        corrected = False
        for _ in range(self.max_corrections):
            wrong_sides = [side for side in "ab" if self.wrong[side]]
            if not wrong_sides:
                break
            for side in wrong_sides:
                await self.correct(side, position, scripted)
                corrected = True
        if corrected and "after_fix" not in self.voted:
            await self.cast("after_fix")

    async def ask(self, text: str, position: int, scripted: ScriptedTurn, sides: Sequence[str]) -> None:
        """Send ``text`` to ``sides``, read the replies, judge and rate each one."""
        self.step = f"sending a prompt to {'/'.join(sides)}"
        frame: dict[str, Any] = {"type": "prompt", "text": text}
        if len(sides) == 1:
            frame["side"] = sides[0]
        await self.send(frame)
        echo = (await self.read_until(lambda frame: frame["type"] == "prompt"))[-1]
        turn = int(echo["turn"])
        # The sides this prompt corrects: those it may correct (a prompt to one side alone, or a
        # scripted correction) whose previous reply was judged wrong (votes.corrections).
        corrects = {side for side in echo.get("corrects") or () if self.wrong[side]}
        texts = await self.read_texts(turn, set(sides))
        for side in sides:
            result = scripted.check(texts[side])
            if result is None:  # A turn without a check: nothing to judge, nothing to correct.
                self.wrong[side] = False
                continue
            correction = side in corrects
            rating = evaluation.rating_for(result, after_correction=correction)
            self.wrong[side] = result.verdict != "correct"
            await self.rate(side, turn, rating)
            self.log.judged.append(Judged(side, turn, position, result.verdict, rating, correction))
            if self.wrong[side]:
                self.reasons[side] = result

    async def correct(self, side: str, position: int, scripted: ScriptedTurn) -> None:
        kind = self.rng.choice(self.feedback_kinds)
        await self.ask(correction_text(self.reasons[side], kind), position, scripted, sides=(side,))
        self.log.corrections += 1

    async def read_texts(self, turn: int, sides: set[str]) -> dict[str, str]:
        """Each side's reply at ``turn``, as its end frame gives it."""
        for side in sides:
            self.result.replies[(turn, side)] = ReplyRecord(side=side, turn=turn)
        texts: dict[str, str] = {}
        while set(texts) != sides:
            self.step = f"reading turn {turn} (ended: {', '.join(sorted(texts)) or 'none'})"
            frame = await self.read()
            if frame["type"] == "end" and frame["turn"] == turn:
                if frame["status"] != "done":
                    raise RuntimeError(f"the reply of side {frame['side']} at turn {turn} ended {frame['status']}")
                texts[frame["side"]] = frame["text"]
                self.result.replies[(turn, frame["side"])].status = frame["status"]
        return texts

    async def rate(self, side: str, turn: int, rating: str) -> None:
        self.step = f"rating side {side} at turn {turn}"
        await self.send({"type": "rate", "side": side, "turn": turn, "rating": rating})
        await self.read_until(lambda frame: frame["type"] == "rated" and frame["side"] == side)

    async def cast(self, stage: str) -> None:
        self.step = f"voting ({stage})"
        await self.send({"type": "vote", "choice": vote_choice(self.wrong), "stage": stage})
        await self.read_until(lambda frame: frame["type"] == "voted")
        self.voted.add(stage)
        self.result.votes += 1
