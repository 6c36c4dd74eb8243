"""What a correction is, and the fix episodes of one side of a battle. No Django.

The arena's distinctive act is telling ONE side what it got wrong while the other side waits. So
a prompt is a **correction** of a side only when that side's previous reply was judged wrong (the
voter's 🍄 or 🔥, or the checker's mistake or garbage) and either

* the voter sent it to that side alone (a prompt to both sides is a new question, never a
  voter's correction), or
* it is a scripted turn the task marks as a correction (``corrects_previous``: the calendar's
  "The current year is 2024."), sent to one side or both. A scripted turn that is not marked
  ("I'm going to a rock concert…") is never a correction, whoever it was sent to.

A direct chat has one side and none that waits: its voter's prompts are never corrections.

A **fix episode** is a wrong reply, the correction sent to that side, and the reply to it: fixed
when the checker judges that reply correct or the voter rates it 🥦 or ✓. When that reply is
wrong too and the next prompt corrects it again, the next episode is the same mistake's next
attempt. 🥦 is offered only on a reply that answers a correction in this sense.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from leaderboard import fixing
from votes import feedback

WRONG = ("mistake", "garbage")  # Ratings and checker verdicts that judge a reply wrong.
FIXED_RATINGS = ("fixed", "correct")  # The voter's ratings of a reply that fixed the mistake.
CORRECT_VERDICT = "correct"

Parts = Mapping[str, bool]


@dataclass(frozen=True)
class Prompt:
    """A user prompt on one side, as corrections read it."""

    text: str
    script_turn: int | None  # The scripted turn it is, sent as written; None: the voter's own words.
    one_side: bool  # Sent to this side alone (the other side got no prompt at this turn).


@dataclass(frozen=True)
class Reply:
    """A reply as fix episodes read it."""

    script_turn: int | None
    rating: str
    verdict: str
    parts: Parts
    content: str

    @property
    def judged_wrong(self) -> bool:
        return judged_wrong(self.rating, self.verdict)


def judged_wrong(rating: str | None, verdict: str | None) -> bool:
    """Whether the voter (🍄/🔥) or the checker (mistake/garbage) judged a reply wrong."""
    return rating in WRONG or verdict in WRONG


def is_correction(prompt: Prompt, previous_wrong: bool, scripted_corrections: Collection[int]) -> bool:
    """Whether ``prompt`` corrects its side's previous reply (judged wrong or not: ``previous_wrong``)."""
    if not previous_wrong:
        return False
    if prompt.script_turn is not None:
        return prompt.script_turn in scripted_corrections
    return prompt.one_side


def may_correct(prompt: Prompt, scripted_corrections: Collection[int]) -> bool:
    """Whether ``prompt`` is a correction should the reply before it be judged wrong: what the
    page needs to know to offer 🥦 on its answer as the voter rates the reply before."""
    return is_correction(prompt, True, scripted_corrections)


@dataclass
class Episode:
    """One attempt at fixing one wrong reply of one side (votes.models.FixEpisode's facts)."""

    wrong_turn: int
    script_turn: int | None  # The wrong reply's scripted turn.
    attempt: int
    correction: str
    scripted: bool
    fixed: bool
    regression: bool | None
    persisted: bool | None
    voter_fixed: bool | None
    checker_fixed: bool | None
    turns_to_fix: int | None = None

    def row(self) -> dict[str, Any]:
        """The stored episode's fields (votes.models.FixEpisode) that this one decides: its
        correction's source (the task's script or the voter) and kind (votes.feedback) too."""
        return {
            "wrong_turn": self.wrong_turn,
            "script_turn": self.script_turn,
            "attempt": self.attempt,
            "correction": self.correction,
            "source": "scripted" if self.scripted else "voter",
            "specificity": feedback.specificity(self.correction),
            "fixed": self.fixed,
            "regression": self.regression,
            "persisted": self.persisted,
            "turns_to_fix": self.turns_to_fix,
            "voter_fixed": self.voter_fixed,
            "checker_fixed": self.checker_fixed,
        }


def side_episodes(
    prompts: Mapping[int, Prompt],
    replies: Mapping[int, Reply],
    scripted_corrections: Collection[int],
    judge_parts: Callable[[int, str], Parts] = lambda position, reply: {},
) -> list[Episode]:
    """The fix episodes of one side, from its prompts and replies by turn.

    ``scripted_corrections``: the positions of the scripted turns marked as corrections.
    ``judge_parts(position, reply)``: a reply judged part by part by that scripted turn's checker
    ({} without one): a scripted correction's turn judges the wrong reply as it judges the
    answer, so that a value the wrong reply's own turn left open (the year, before "The current
    year is 2024.") is a fact it got wrong. Where the checker judged both replies part by part:
    whether the answer broke a part that was right (``regression``) and whether what it fixed
    stayed right in the side's later turns (``persisted``)."""
    turns = sorted(replies)
    episodes: list[Episode] = []
    chain: list[Episode] = []  # The attempts at the mistake being corrected.

    def close_chain() -> None:
        taken = fixing.turns_to_fix([episode.fixed for episode in chain])
        for episode in chain:
            episode.turns_to_fix = taken
        chain.clear()

    for turn, following in itertools.pairwise([*turns, None]):
        wrong = replies[turn]
        prompt = prompts.get(following) if following is not None else None
        if prompt is None or not is_correction(prompt, wrong.judged_wrong, scripted_corrections):
            close_chain()
            continue
        answer = replies[following]
        if not (answer.rating or answer.verdict):
            continue  # The reply to the correction was never judged: no outcome.
        parts = wrong.parts
        if prompt.script_turn is not None:
            parts = judge_parts(prompt.script_turn, wrong.content) or parts
        fixed = answer.verdict == CORRECT_VERDICT or answer.rating in FIXED_RATINGS
        later = [replies[t].parts for t in turns if t > following]
        episode = Episode(
            wrong_turn=turn,
            script_turn=wrong.script_turn,
            attempt=len(chain) + 1,
            correction=prompt.text,
            scripted=prompt.script_turn is not None,
            fixed=fixed,
            regression=fixing.regressed(parts, answer.parts),
            persisted=fixing.persisted(fixing.fixed_parts(parts, answer.parts), later) if fixed else None,
            voter_fixed=answer.rating in FIXED_RATINGS if wrong.rating in WRONG and answer.rating else None,
            checker_fixed=answer.verdict == CORRECT_VERDICT if wrong.verdict in WRONG and answer.verdict else None,
        )
        episodes.append(episode)
        chain.append(episode)
        if fixed:
            close_chain()
    close_chain()
    return episodes


@dataclass(frozen=True)
class Message:
    """A stored message of a battle, as ``battle_episodes`` reads it."""

    side: str
    turn: int
    role: str  # "user" or "assistant"
    content: str
    script_turn: int | None
    rating: str = ""
    verdict: str = ""
    parts: Parts | None = None


def battle_episodes(
    messages: list[Message],
    scripted_corrections: Collection[int],
    judge_parts: Callable[[int, str], Parts] = lambda position, reply: {},
    *,
    one_side_corrects: bool = True,
) -> dict[str, list[Episode]]:
    """Every side's fix episodes of one battle, from its messages (any order).
    ``one_side_corrects``: False for a direct chat, which has one side and none that waits, so
    its voter's prompts are never corrections (its scripted corrections still are)."""
    sides_at: dict[int, set[str]] = {}
    for message in messages:
        if message.role == "user":
            sides_at.setdefault(message.turn, set()).add(message.side)
    found: dict[str, list[Episode]] = {}
    for side in sorted({message.side for message in messages}):
        prompts: dict[int, Prompt] = {}
        replies: dict[int, Reply] = {}
        for message in messages:
            if message.side != side:
                continue
            if message.role == "user":
                alone = one_side_corrects and sides_at[message.turn] == {side}
                prompts[message.turn] = Prompt(message.content, message.script_turn, alone)
            else:
                replies[message.turn] = Reply(
                    message.script_turn, message.rating, message.verdict, message.parts or {}, message.content
                )
        found[side] = side_episodes(prompts, replies, scripted_corrections, judge_parts)
    return found
