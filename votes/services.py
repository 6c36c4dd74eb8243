"""Writes for battles: starting them, taking prompts, storing replies and votes."""

import hashlib
import hmac
import random
import secrets
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
        .exclude(status__in=Message.FINISHED_STATUSES)
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
            battle=battle,
            side=side,
            turn=turn,
            role=Message.Role.ASSISTANT,
            status=Message.Status.PENDING,
            seed=secrets.randbelow(2**31),
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


@dataclass(frozen=True)
class StoppedReply:
    """A reply the voter stopped before any worker had started it: nobody else will end it."""

    side: str
    turn: int


@transaction.atomic
def request_stop(*, battle: Battle, side: str | None = None) -> list[StoppedReply]:
    """Stop the battle's unfinished replies (one side, or both when side is None).

    Replies being generated are flagged; their worker stops at its next flush. Replies still
    waiting for a worker are stopped here and returned, so the caller can announce their end.
    """
    unfinished = Message.objects.select_for_update().filter(
        battle=battle, role=Message.Role.ASSISTANT, status__in=[Message.Status.PENDING, Message.Status.STREAMING]
    )
    if side is not None:
        unfinished = unfinished.filter(side=side)
    stopped_now = []
    for reply in unfinished:
        if reply.status == Message.Status.PENDING:
            reply.status = Message.Status.STOPPED
            reply.stop_reason = "cancelled"
            reply.token_count = 0
            stopped_now.append(StoppedReply(side=reply.side, turn=reply.turn))
        reply.stop_requested = True
        reply.save(update_fields=["status", "stop_reason", "token_count", "stop_requested"])
    return stopped_now


# --- Replies, written by the generation worker ----------------------------------------------------


def claim_reply(message_id: int) -> str | None:
    """Claim a reply for generation. Returns its previous status ("pending", or "streaming" for
    a job redelivered after a worker was lost: it starts over), or None if there is nothing to
    do (finished, stopped by the voter, or gone)."""
    with transaction.atomic():
        reply = (
            Message.objects.select_for_update()
            .filter(pk=message_id, role=Message.Role.ASSISTANT, stop_requested=False)
            .filter(status__in=[Message.Status.PENDING, Message.Status.STREAMING])
            .first()
        )
        if reply is None:
            return None
        previous = reply.status
        Message.objects.filter(pk=message_id).update(status=Message.Status.STREAMING, content="", delta_count=0)
    return previous


def save_partial_reply(message_id: int, *, content: str, delta_count: int) -> bool:
    """Persist the text streamed so far before its deltas are published, so reconnects resume.

    Returns False when the voter has asked to stop this reply: the worker should cancel it.
    """
    return (
        Message.objects.filter(pk=message_id, status=Message.Status.STREAMING, stop_requested=False).update(
            content=content, delta_count=delta_count
        )
        == 1
    )


def finish_reply(
    message_id: int,
    *,
    status: str,
    content: str,
    delta_count: int,
    stop_reason: str,
    token_count: int,
    time_to_first_token_ms: int | None,
    duration_ms: int,
) -> None:
    Message.objects.filter(pk=message_id).update(
        status=status,
        content=content,
        delta_count=delta_count,
        stop_reason=stop_reason,
        token_count=token_count,
        time_to_first_token_ms=time_to_first_token_ms,
        duration_ms=duration_ms,
    )
