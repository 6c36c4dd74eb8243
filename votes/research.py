"""Research data: votes as records compatible with the public arena's clean_battle dumps.

Reads only (selectors for the research API and export_dump). A record is one vote: the
clean_battle fields (question_id, model_a, model_b, winner, judge, conversation_a,
conversation_b, turn, anony, language, tstamp) and this arena's own (stage, corrections,
ratings, checker verdicts, task, exclusion). No IP address or session key ever appears: the
judge is a keyed hash of the voter, stable across exports.
"""

import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, QuerySet

from leaderboard.selectors import counted_votes, in_category
from votes.models import Battle, FlaggedVoter, Message, Vote

WINNERS = {"a": "model_a", "b": "model_b", "tie": "tie", "both_bad": "tie (bothbad)"}


def judge_id(voter_key: str) -> str:
    """A stable pseudonym of the voter: HMAC with a server secret (ARENA_JUDGE_SECRET)."""
    secret = settings.ARENA_JUDGE_SECRET.encode()
    return "judge-" + hmac.new(secret, f"judge:{voter_key}".encode(), hashlib.sha256).hexdigest()[:20]


def research_votes(*, category: str = "overall", include_excluded: bool = False) -> QuerySet[Vote]:
    """The votes of a category: those the leaderboard counts, or every one (then with the
    reason each would be left out)."""
    votes = in_category(Vote.objects.all(), category) if include_excluded else counted_votes(category)
    flagged = Exists(FlaggedVoter.objects.filter(voter_key=OuterRef("battle__voter_key")))
    return votes.annotate(voter_flagged=flagged).select_related("battle__model_a", "battle__model_b", "battle__task")


def all_votes() -> QuerySet[Vote]:
    """Every vote of every stage, oldest first, with what exclusion_reason needs."""
    flagged = Exists(FlaggedVoter.objects.filter(voter_key=OuterRef("battle__voter_key")))
    return (
        Vote.objects.annotate(voter_flagged=flagged)
        .select_related("battle__model_a", "battle__model_b", "battle__task")
        .order_by("pk")
    )


def exclusion_reason(vote: Vote) -> str | None:
    battle = vote.battle
    if battle.excluded:
        return f"identity leak: {battle.excluded_reason}"
    if getattr(vote, "voter_flagged", False):
        return "flagged voter"
    if battle.state != Battle.State.ENDED:
        return "unfinished battle"
    return None


def _conversations(battle: Battle, through_turn: int) -> dict[str, Any]:
    """Per side, the conversation the voter had seen, and the corrections sent to one side."""
    messages = list(Message.objects.filter(battle=battle, turn__lte=through_turn).order_by("turn", "-role", "side"))
    user_sides: dict[int, set[str]] = {}
    for message in messages:
        if message.role == Message.Role.USER:
            user_sides.setdefault(message.turn, set()).add(message.side)
    conversation: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    ratings: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for message in messages:
        conversation[message.side].append(
            {
                "role": message.role,
                "content": message.content,
                "num_tokens": message.token_count if message.role == Message.Role.ASSISTANT else None,
            }
        )
        if message.role == Message.Role.ASSISTANT:
            ratings[message.side].append(
                {
                    "turn": message.turn,
                    "status": message.status,
                    "rating": message.rating or None,
                    "check_verdict": message.check_verdict or None,
                    "check_reason": message.check_reason or None,
                    "regenerations": message.regenerations,
                }
            )
    corrections = [
        {"side": next(iter(sides)), "turn": turn, "text": _prompt_text(messages, turn)}
        for turn, sides in sorted(user_sides.items())
        if len(sides) == 1
    ]
    return {"conversation": conversation, "ratings": ratings, "corrections": corrections, "turns": len(user_sides)}


def _prompt_text(messages: list[Message], turn: int) -> str:
    return next(m.content for m in messages if m.turn == turn and m.role == Message.Role.USER)


def vote_record(vote: Vote, *, with_exclusion: bool = False) -> dict[str, Any]:
    battle = vote.battle
    seen = _conversations(battle, vote.after_turn)
    moment = battle.ended or vote.created
    record: dict[str, Any] = {
        "question_id": f"{battle.public_id}:{vote.stage}",
        "model_a": battle.model_a.name,
        "model_b": battle.model_b.name,
        "winner": WINNERS[vote.choice],
        "judge": judge_id(battle.voter_key),
        "conversation_a": seen["conversation"]["a"],
        "conversation_b": seen["conversation"]["b"],
        "turn": seen["turns"],
        "anony": True,
        "language": "unknown",
        "tstamp": moment.timestamp(),
        # This arena's own fields.
        "vote_id": vote.pk,
        "battle_id": battle.public_id,
        "stage": vote.stage,
        "after_turn": vote.after_turn,
        "corrections": seen["corrections"],
        "ratings_a": seen["ratings"]["a"],
        "ratings_b": seen["ratings"]["b"],
        "task": battle.task.slug if battle.task else None,
        "task_category": battle.task.category if battle.task else None,
        "system_prompt": battle.task.system_prompt if battle.task else None,
    }
    if with_exclusion:
        reason = exclusion_reason(vote)
        record["excluded"] = reason is not None
        record["excluded_reason"] = reason
    return record


def vote_records(votes: QuerySet[Vote], *, with_exclusion: bool = False) -> Iterator[dict[str, Any]]:
    for vote in votes.iterator(chunk_size=500):
        yield vote_record(vote, with_exclusion=with_exclusion)


CSV_FIELDS = (
    "question_id",
    "model_a",
    "model_b",
    "winner",
    "judge",
    "turn",
    "anony",
    "language",
    "tstamp",
    "vote_id",
    "battle_id",
    "stage",
    "after_turn",
    "task",
    "task_category",
    "conversation_a",
    "conversation_b",
    "corrections",
    "ratings_a",
    "ratings_b",
    "system_prompt",
    "excluded",
    "excluded_reason",
)
