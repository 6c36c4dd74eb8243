"""Reads for battles: what a voter may see, and what a generation job needs."""

from dataclasses import dataclass
from typing import Any

from inference.models import LLM
from votes.models import Battle, Message


def battle_group(public_id: str) -> str:
    """The channel-layer group that carries one battle's frames."""
    return f"battle.{public_id}"


def battle_for_voter(*, public_id: str, voter_key: str) -> Battle | None:
    """The battle if it belongs to this voter; None otherwise, so ids of others reveal nothing."""
    return Battle.objects.select_related("model_a", "model_b").filter(public_id=public_id, voter_key=voter_key).first()


def battle_state(battle: Battle) -> dict[str, Any]:
    """The full state frame a (re)connecting client rebuilds its view from.

    Model names are included only once the battle is voted (Battle.reveal()).
    """
    turns: dict[int, dict[str, Any]] = {}
    for message in Message.objects.filter(battle=battle).order_by("turn", "side", "role"):
        turn = turns.setdefault(message.turn, {"turn": message.turn, "prompt": "", "replies": {}})
        if message.role == Message.Role.USER:
            turn["prompt"] = message.content
            continue
        turn["replies"][message.side] = {
            "status": message.status,
            "text": message.content,
            "seq": message.delta_count,
            "stats": (
                reply_stats(
                    tokens=message.token_count or 0,
                    ttft_ms=message.time_to_first_token_ms,
                    duration_ms=message.duration_ms or 0,
                )
                if message.status in (Message.Status.DONE, Message.Status.STOPPED)
                else {}
            ),
        }
    vote = getattr(battle, "vote", None)
    return {
        "type": "state",
        "battle": battle.public_id,
        "turns": [turns[index] for index in sorted(turns)],
        "vote": vote.choice if vote else None,
        "models": battle.reveal(),
    }


def reply_stats(*, tokens: int, ttft_ms: int | None, duration_ms: int) -> dict[str, Any]:
    """The stats shown under a finished reply (end frames and state frames alike)."""
    seconds = duration_ms / 1000
    return {
        "tokens": tokens,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
    }


@dataclass(frozen=True)
class GenerationContext:
    """Everything a worker needs to generate one reply, read in one go from the database."""

    message_id: int
    battle_public_id: str
    side: str
    turn: int
    model: LLM
    seed: int
    # (role, content) pairs of this side's conversation up to and including the prompt to answer.
    conversation: list[tuple[str, str]]


def generation_context(message_id: int) -> GenerationContext | None:
    reply = (
        Message.objects.select_related("battle__model_a", "battle__model_b")
        .filter(pk=message_id, role=Message.Role.ASSISTANT)
        .first()
    )
    if reply is None:
        return None
    history = Message.objects.filter(battle=reply.battle, side=reply.side, turn__lte=reply.turn).order_by(
        "turn", "-role"
    )
    # Within a turn the user message comes first ("user" > "assistant", hence -role); the reply
    # being generated is left out.
    conversation = [(m.role, m.content) for m in history if m.pk != reply.pk]
    return GenerationContext(
        message_id=reply.pk,
        battle_public_id=reply.battle.public_id,
        side=reply.side,
        turn=reply.turn,
        model=reply.battle.model_on(reply.side),
        seed=reply.seed or 0,
        conversation=conversation,
    )
