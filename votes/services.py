"""Writes for battles: starting them, taking prompts, storing replies and votes."""

import hashlib
import hmac
import random
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction

from inference.models import LLM
from votes.models import Battle, Message, Side, Vote
from votes.protocol import ArenaError

SIDES = (Side.A, Side.B)


@dataclass(frozen=True)
class GenerationJob:
    """One reply to generate: which message row to fill and which model queue to send it to."""

    message_id: int
    queue: str


@dataclass(frozen=True)
class SubmittedPrompt:
    turn: int
    text: str
    jobs: list[GenerationJob]


def voter_key_for(session_key: str) -> str:
    """A keyed hash of the session: battles are tied to a voter without storing the session id."""
    return hmac.new(settings.SECRET_KEY.encode(), f"voter:{session_key}".encode(), hashlib.sha256).hexdigest()


def start_battle(*, voter_key: str, rng: random.Random | None = None) -> Battle:
    """Draw two different enabled models by sampling weight and put them on random sides."""
    rng = rng or random.SystemRandom()
    candidates = list(LLM.objects.enabled())
    if len(candidates) < 2:
        raise ArenaError("no_models", "The arena needs at least two enabled models; try again later.")
    first = rng.choices(candidates, weights=[m.sampling_weight for m in candidates])[0]
    rest = [m for m in candidates if m.pk != first.pk]
    second = rng.choices(rest, weights=[m.sampling_weight for m in rest])[0]
    model_a, model_b = (first, second) if rng.random() < 0.5 else (second, first)
    return Battle.objects.create(model_a=model_a, model_b=model_b, voter_key=voter_key)


def _locked(battle: Battle) -> Battle:
    """The battle re-read under a row lock: prompts and votes on one battle run one at a time."""
    return Battle.objects.select_for_update(of=("self",)).select_related("model_a", "model_b").get(pk=battle.pk)


def _has_unfinished_replies(battle: Battle) -> bool:
    return (
        Message.objects.filter(battle=battle, role=Message.Role.ASSISTANT)
        .exclude(status__in=[Message.Status.DONE, Message.Status.FAILED])
        .exists()
    )


@transaction.atomic
def submit_prompt(*, battle: Battle, text: str) -> SubmittedPrompt:
    """Store the user's prompt on both sides and a pending reply for each side to fill."""
    battle = _locked(battle)
    if battle.is_voted:
        raise ArenaError("battle_closed", "This battle has been voted on; start a new battle to go on.")
    if _has_unfinished_replies(battle):
        raise ArenaError("busy", "Wait until both replies are finished before sending the next prompt.")
    turn = Message.objects.filter(battle=battle, role=Message.Role.USER).values("turn").distinct().count()
    if turn >= settings.ARENA_MAX_TURNS:
        raise ArenaError("too_many_turns", f"A battle has at most {settings.ARENA_MAX_TURNS} turns; please vote.")
    jobs = []
    for side in SIDES:
        Message.objects.create(battle=battle, side=side, turn=turn, role=Message.Role.USER, content=text)
        reply = Message.objects.create(
            battle=battle, side=side, turn=turn, role=Message.Role.ASSISTANT, status=Message.Status.PENDING
        )
        jobs.append(GenerationJob(message_id=reply.pk, queue=battle.model_on(side).queue))
    return SubmittedPrompt(turn=turn, text=text, jobs=jobs)


@transaction.atomic
def cast_vote(*, battle: Battle, choice: str) -> Vote:
    """Store the vote and close the battle; `vote.battle.reveal()` then names the models."""
    battle = _locked(battle)
    if battle.is_voted:
        raise ArenaError("already_voted", "This battle already has a vote.")
    if not Message.objects.filter(battle=battle, role=Message.Role.ASSISTANT).exists():
        raise ArenaError("not_ready", "Send a prompt and read both replies before voting.")
    if _has_unfinished_replies(battle):
        raise ArenaError("not_ready", "Wait until both replies are finished before voting.")
    if choice not in Vote.Choice.values:
        raise ArenaError("bad_frame", f"Unknown vote choice {choice!r}.")
    try:
        with transaction.atomic():
            vote = Vote.objects.create(battle=battle, choice=choice)
    except IntegrityError:
        raise ArenaError("already_voted", "This battle already has a vote.") from None
    battle.state = Battle.State.VOTED
    battle.save(update_fields=["state"])
    return vote


# --- Replies, written by the generation worker ----------------------------------------------------


def mark_reply_streaming(message_id: int) -> bool:
    """Claim a pending reply for generation; False if it is already finished (a redelivered job)."""
    claimed = Message.objects.filter(
        pk=message_id,
        role=Message.Role.ASSISTANT,
        status__in=[Message.Status.PENDING, Message.Status.STREAMING],
    ).update(status=Message.Status.STREAMING, content="", delta_count=0)
    return claimed == 1


def save_partial_reply(message_id: int, *, content: str, delta_count: int) -> None:
    """Persist the text streamed so far before its deltas are published, so reconnects resume."""
    Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
        content=content, delta_count=delta_count
    )


def complete_reply(
    message_id: int,
    *,
    content: str,
    delta_count: int,
    token_count: int,
    time_to_first_token_ms: int | None,
    duration_ms: int,
) -> None:
    Message.objects.filter(pk=message_id).update(
        content=content,
        delta_count=delta_count,
        status=Message.Status.DONE,
        token_count=token_count,
        time_to_first_token_ms=time_to_first_token_ms,
        duration_ms=duration_ms,
    )


def fail_reply(message_id: int, *, content: str, delta_count: int, duration_ms: int) -> None:
    Message.objects.filter(pk=message_id).update(
        content=content,
        delta_count=delta_count,
        status=Message.Status.FAILED,
        duration_ms=duration_ms,
    )
