"""Writes for battles: starting them, taking prompts, storing replies and votes."""

import hashlib
import hmac
import logging
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, Max, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from arena_site import networks
from inference import readiness
from inference.models import LLM
from leaderboard import style
from votes import corrections, metrics, pacing, pairing, selectors
from votes.checkers import CheckerConfigError
from votes.leaks import find_identity_leak
from votes.models import (
    Battle,
    FixEpisode,
    Message,
    Rating,
    ResearcherKey,
    Side,
    Task,
    TaskTurn,
    Vote,
    check_scripted,
    new_public_id,
)
from votes.protocol import ArenaError, end_frame

SIDES = (Side.A, Side.B)
logger = logging.getLogger(__name__)


# What the voter reads when a reply's worker was lost (votes.services.fail_stalled_replies).
WORKER_LOST = "The model server stopped while writing this reply. Retry it, or vote."
NOT_PICKED_UP = "No model server took this reply in time. Retry it, or vote."
WORKER_ERROR = "The model server hit an error while writing this reply. Retry it, or vote."
NOT_QUEUED = "The model servers can't be reached right now. Retry this reply in a moment, or vote."
# The cause each is counted under (arena_replies_failed_total).
FAILURE_CAUSES = {
    WORKER_LOST: metrics.WORKER_LOST,
    NOT_PICKED_UP: metrics.NOT_PICKED_UP,
    WORKER_ERROR: metrics.WORKER_ERROR,
    NOT_QUEUED: metrics.NOT_QUEUED,
}


@dataclass(frozen=True)
class GenerationJob:
    """One reply to generate: which message row to fill and which model queue to send it to.

    ``attempt`` is the reply's regeneration count when the job was queued: a job redelivered
    after the reply was retried (a lost worker's, restored by the broker) finds nothing to do.
    """

    message_id: int
    queue: str
    attempt: int = 0


@dataclass(frozen=True)
class FailedReply:
    """A reply failed here, for the caller to announce with an end frame."""

    battle_public_id: str
    side: str
    turn: int
    seq: int
    text: str
    error: str

    def end_frame(self) -> dict[str, Any]:
        return end_frame(
            self.side, self.turn, seq=self.seq, status=Message.Status.FAILED, text=self.text, error=self.error
        )


@dataclass(frozen=True)
class SubmittedPrompt:
    turn: int
    text: str
    jobs: list[GenerationJob]
    side: str | None = None  # None: both sides.
    corrects: tuple[str, ...] = ()  # The sides where it corrects the reply before, if judged wrong (votes.corrections).


@dataclass(frozen=True)
class RegeneratedReply:
    side: str
    turn: int
    job: GenerationJob


def voter_key_for(session_key: str) -> str:
    """A keyed hash of the session: battles are tied to a voter without storing the session id."""
    return hmac.new(settings.SECRET_KEY.encode(), f"voter:{session_key}".encode(), hashlib.sha256).hexdigest()


def network_key_for(address: str | None) -> str:
    """A keyed hash of the client's network (/24 or /64, arena_site.networks): the identity a
    fresh session does not reset. "" without an address; the address itself is never stored."""
    return networks.network_key(address, settings.SECRET_KEY.encode())


# Why a battle in which the voter knew the names stays off the leaderboard (Battle.exclude).
NAMED_MODE_REASON = "named mode: the voter picked the models and saw their names"
DIRECT_MODE_REASON = "direct chat with one model: nothing to compare"


def _chosen_models(names: Sequence[str], mode: str) -> list[LLM]:
    """The enabled models the voter picked by name: two different ones side by side, one to chat."""
    wanted = 2 if mode == Battle.Mode.NAMED else 1
    if len(names) != wanted or len(set(names)) != wanted:
        raise ArenaError(
            "bad_models",
            "Pick two different models to compare." if wanted == 2 else "Pick the one model to chat with.",
        )
    found = {llm.name: llm for llm in LLM.objects.enabled().filter(name__in=names)}
    missing = [name for name in names if name not in found]
    if missing:
        raise ArenaError("no_model", f"There is no enabled model named {missing[0][:60]!r}; pick one from the list.")
    if readiness.required():
        ready = readiness.ready_names(names)
        for name in names:
            if name not in ready:
                raise ArenaError(
                    "model_not_ready",
                    f"{name} is not ready yet (it is being loaded, or its server does not answer); pick a model "
                    "marked ready, or try again in a minute.",
                )
    return [found[name] for name in names]


def _warming_message(roster: selectors.RosterStatus) -> str:
    if roster.warming or roster.ready:
        return (
            f"The models are still warming up: {roster.ready} of {roster.total} ready, and a battle needs "
            f"{roster.needed}. Try again in a minute; this page says when they are ready."
        )
    return f"None of the arena's {roster.total} models is ready: their servers are not answering. Try again later."


def start_battle(
    *,
    voter_key: str,
    task: Task | None = None,
    rng: random.Random | None = None,
    mode: str = Battle.Mode.ANONYMOUS,
    models: Sequence[str] = (),
    network_key: str = "",
) -> Battle:
    """An anonymous battle draws two different enabled models that sample (votes.pairing,
    ``ARENA_PAIR_SAMPLING``; selectors.pairing_candidates) on random sides. A named one puts the
    two models the voter picked on sides A and B, a direct chat the one model on side A: both are
    kept off the leaderboard, and either may use a greedy model."""
    if task is not None and not task.active:
        raise ArenaError("no_task", "This task is not offered any more; pick another one.")
    if mode != Battle.Mode.ANONYMOUS:
        if mode not in Battle.Mode.values:
            raise ArenaError("bad_frame", f"Unknown battle mode {mode[:40]!r}.")
        chosen = _chosen_models(models, mode)
        model_a, model_b = chosen if mode == Battle.Mode.NAMED else (chosen[0], chosen[0])
        return Battle.objects.create(
            model_a=model_a,
            model_b=model_b,
            task=task,
            **(task.snapshot() if task is not None else {}),
            voter_key=voter_key,
            network_key=network_key,
            mode=mode,
            excluded=True,
            excluded_reason=NAMED_MODE_REASON if mode == Battle.Mode.NAMED else DIRECT_MODE_REASON,
            pace_chars_per_s=battle_pace(model_a.pk, model_b.pk),
        )
    if models:
        raise ArenaError("bad_models", "An anonymous battle's models are drawn, not picked.")
    rng = rng or random.SystemRandom()
    active = settings.ARENA_PAIR_SAMPLING == "active"
    candidates = selectors.pairing_candidates(with_ratings=active)
    if readiness.required():
        roster = selectors.roster_status()
        if roster.total >= 2 and not roster.battles_possible:
            raise ArenaError("no_models", _warming_message(roster))
    weights = pairing.pair_weights(
        candidates,
        policy=settings.ARENA_PAIR_SAMPLING,
        pair_votes=selectors.pair_vote_counts() if active else None,
        new_model_boost=settings.ARENA_NEW_MODEL_BOOST,
        new_model_battles=settings.ARENA_NEW_MODEL_BATTLES,
    )
    if not weights:
        raise ArenaError(
            "no_models",
            "The arena needs at least two enabled models that sample and whose context holds its longest "
            "conversation (other models are not drawn for anonymous battles); try again later.",
        )
    id_a, id_b = pairing.draw_pair(weights, rng)
    drawable = [candidate.id for candidate in candidates]
    return Battle.objects.create(
        model_a_id=id_a,
        model_b_id=id_b,
        task=task,
        **(task.snapshot() if task is not None else {}),
        voter_key=voter_key,
        network_key=network_key,
        # The pace and the first text's wait are the arena's, not the pair's: either would name it.
        pace_chars_per_s=battle_pace(*drawable),
        first_text_lead_s=first_text_lead(drawable),
        pair_probability=weights[(min(id_a, id_b), max(id_a, id_b))] / sum(weights.values()),
    )


def battle_pace(*model_ids: int) -> float:
    """The pace of a battle among these models: what the slowest one sustains (votes.pacing).
    A named or direct battle passes its own models, an anonymous one every model it could draw."""
    sustained = dict(LLM.objects.filter(pk__in=model_ids).values_list("pk", "sustained_chars_per_s"))
    return pacing.battle_pace(
        settings.ARENA_STREAM_CHARS_PER_S,
        [sustained.get(pk) for pk in model_ids],
        unmeasured=settings.ARENA_STREAM_UNMEASURED_CHARS_PER_S,
        margin=settings.ARENA_STREAM_PACE_MARGIN,
    )


def first_text_lead(model_ids: Sequence[int]) -> float:
    """Seconds an anonymous reply's pace waits after its worker starts: the longest typical time
    to first token of these models, the ones anonymous battles may draw (votes.pacing)."""
    typical_ms = LLM.objects.filter(pk__in=model_ids).values_list("typical_first_token_ms", flat=True)
    pacing_on = settings.ARENA_STREAM_CHARS_PER_S > 0 or settings.ARENA_STREAM_FIRST_TEXT_SECONDS > 0
    return pacing.first_text_lead([None if ms is None else ms / 1000 for ms in typical_ms], pacing=pacing_on)


def mark_first_token(message_id: int) -> None:
    """The reply's model produced its first text (the other side's worker may be waiting for it)."""
    # The database's clock, as hold_state reads it: the two sides' hosts may disagree.
    Message.objects.filter(pk=message_id, first_token_at__isnull=True).update(first_token_at=Now())


def _locked(battle: Battle) -> Battle:
    """The battle re-read under a row lock: prompts and votes on one battle run one at a time."""
    return Battle.objects.select_for_update(of=("self",)).select_related("model_a", "model_b", "task").get(pk=battle.pk)


def _unfinished_sides(battle: Battle) -> set[str]:
    return set(
        Message.objects.filter(battle=battle, role=Message.Role.ASSISTANT)
        .exclude(status__in=Message.FINISHED_STATUSES)
        .values_list("side", flat=True)
    )


def _has_unfinished_replies(battle: Battle) -> bool:
    return bool(_unfinished_sides(battle))


def _refuse_if_ended(battle: Battle) -> None:
    if battle.is_ended:
        raise ArenaError("battle_closed", "This battle has ended; start a new battle to go on.")


def _refuse_if_closed(battle: Battle) -> None:
    """Ended, or closed by a model naming itself after the vote: no more prompts, votes, ratings."""
    _refuse_if_ended(battle)
    if battle.closed_reason:
        raise ArenaError(
            "named_after_vote",
            "A reply named a model after your vote: the votes you cast before it count, and this battle "
            "takes no more prompts, votes or ratings. End it to see the names.",
        )


def _acted(battle: Battle) -> None:
    """The voter did something from a page of the battle: its idle clock starts again."""
    now = timezone.now()
    Battle.objects.filter(pk=battle.pk).update(last_action=now, seen_at=now)


def _script_turns(battle: Battle, side: str, text: str) -> tuple[int | None, int | None]:
    """For a prompt on one side of a task battle: the scripted turn it is (the side's next one,
    sent as written) and the one its reply is checked against (that one, or, for a correction,
    the scripted turn it corrects)."""
    if battle.task_id is None:
        return None, None
    last = (
        Message.objects.filter(battle=battle, side=side, role=Message.Role.USER, script_turn__isnull=False)
        .order_by("-turn")
        .values_list("script_turn", flat=True)
        .first()
    )
    position = 0 if last is None else last + 1
    scripted = battle.scripted_turn(position)
    if scripted is not None and scripted["prompt"].strip() == text.strip():
        return position, position
    return None, last


def _new_reply(battle: Battle, side: str, turn: int, script_turn: int | None) -> GenerationJob:
    reply = Message.objects.create(
        battle=battle,
        side=side,
        turn=turn,
        role=Message.Role.ASSISTANT,
        status=Message.Status.PENDING,
        seed=secrets.randbelow(2**31),
        script_turn=script_turn,
        heartbeat=timezone.now(),
    )
    return GenerationJob(message_id=reply.pk, queue=battle.model_on(side).queue)


def _refuse_if_too_long(battle: Battle, targets: Sequence[str], text: str) -> None:
    """The arena's limit on a conversation's length, the same whichever models play: past it no
    model is asked (inference.context_budget; every anonymous model's context holds it)."""
    limit = settings.ARENA_MAX_CONVERSATION_BYTES
    size = max(selectors.conversation_size(battle, target, text) for target in targets)
    if size > limit:
        raise ArenaError(
            "conversation_too_long",
            f"With this prompt the conversation would come to {size:,} of the {limit:,} bytes a battle may hold "
            "(the same limit with every model); send a shorter prompt, or vote and start a new battle.",
        )


@transaction.atomic
def start_battle_with_prompt(*, voter_key: str, network_key: str, text: str) -> tuple[Battle, SubmittedPrompt]:
    """A free-chat battle and its first prompt, stored together: a prompt that is refused, or a
    server that stops between the two, leaves no battle without messages."""
    battle = start_battle(voter_key=voter_key, network_key=network_key)
    return battle, submit_prompt(battle=battle, text=text)


@transaction.atomic
def submit_prompt(*, battle: Battle, text: str, side: str | None = None) -> SubmittedPrompt:
    """Store the user's prompt and a pending reply, on both sides or on ``side`` only.

    A prompt to one side is how a voter corrects that side's mistake: the other side is paused
    (it gets nothing, and its history is unchanged).
    """
    battle = _locked(battle)
    _refuse_if_closed(battle)
    _acted(battle)
    direct = battle.mode == Battle.Mode.DIRECT
    if direct and side == Side.B:
        raise ArenaError("one_side", "A direct chat has one model, on side A.")
    # A side whose reply is finished can be corrected at once, while the other still writes.
    unfinished = _unfinished_sides(battle)
    if side is not None and side in unfinished:
        raise ArenaError(
            "busy", f"Wait until {side.upper()}'s reply is finished (or stop it) before sending to it again."
        )
    if side is None and unfinished:
        raise ArenaError(
            "busy",
            "Wait until both replies are finished before sending to both; a finished side can be rated or "
            "corrected (sent to alone) already.",
        )
    turn = Message.objects.filter(battle=battle, role=Message.Role.USER).values("turn").distinct().count()
    if turn >= settings.ARENA_MAX_TURNS:
        raise ArenaError("too_many_turns", f"A battle has at most {settings.ARENA_MAX_TURNS} turns; please vote.")
    if direct:
        side = Side.A  # Every message of a direct chat goes to its one model.
    elif turn == 0 and side is not None:
        raise ArenaError("both_sides_first", "The first prompt goes to both sides.")
    elif turn > 0 and not battle.votes.filter(stage=Vote.Stage.FIRST_TRY).exists():
        raise ArenaError("vote_first", "Say which side did better on the first try before going on.")
    jobs, corrects = [], []
    targets = SIDES if side is None else (side,)
    _refuse_if_too_long(battle, targets, text)
    for target in targets:
        script_turn, checked_turn = _script_turns(battle, target, text)
        Message.objects.create(
            battle=battle, side=target, turn=turn, role=Message.Role.USER, content=text, script_turn=script_turn
        )
        jobs.append(_new_reply(battle, target, turn, checked_turn))
        prompt = corrections.Prompt(text, script_turn, one_side=len(targets) == 1 and not direct)
        if corrections.may_correct(prompt, battle.scripted_corrections):
            corrects.append(target)
    return SubmittedPrompt(turn=turn, text=text, jobs=jobs, side=side, corrects=tuple(corrects))


@transaction.atomic
def regenerate_reply(*, battle: Battle, side: str) -> RegeneratedReply:
    """Generate one side's latest reply again, from the same conversation, with a new seed."""
    battle = _locked(battle)
    _refuse_if_closed(battle)
    _acted(battle)
    reply = (
        Message.objects.select_for_update()
        .filter(battle=battle, side=side, role=Message.Role.ASSISTANT)
        .order_by("-turn")
        .first()
    )
    if reply is None:
        raise ArenaError("not_ready", "This side has no reply to regenerate yet.")
    if not reply.is_finished:
        raise ArenaError("busy", "Wait until the reply is finished (or stop it) before regenerating it.")
    if battle.votes.filter(after_turn__gte=reply.turn).exists():
        raise ArenaError("already_voted", "You have voted on this reply; it can't be regenerated.")
    reply.status = Message.Status.PENDING
    reply.content = ""
    reply.delta_count = 0
    reply.stop_requested = False
    reply.stop_reason = ""
    reply.error = ""
    reply.heartbeat = timezone.now()
    reply.seed = secrets.randbelow(2**31)
    reply.token_count = reply.time_to_first_token_ms = reply.duration_ms = None
    reply.rating = reply.check_verdict = reply.check_reason = reply.identity_leak = ""
    reply.check_parts = {}
    reply.regenerations += 1
    reply.save()
    job = GenerationJob(message_id=reply.pk, queue=battle.model_on(side).queue, attempt=reply.regenerations)
    return RegeneratedReply(side=side, turn=reply.turn, job=job)


def _previous_reply(reply: Message) -> Message | None:
    return (
        Message.objects.filter(battle=reply.battle, side=reply.side, role=Message.Role.ASSISTANT, turn__lt=reply.turn)
        .order_by("-turn")
        .first()
    )


def _answers_a_correction(reply: Message) -> bool:
    """Whether the reply answers a correction (votes.corrections): the side's reply before it
    was judged wrong (rated or checked so), and its prompt went to that side alone or is a
    scripted correction. 🥦 then fits."""
    previous = _previous_reply(reply)
    if previous is None:
        return False
    return corrections.is_correction(
        selectors.correction_prompt(reply),
        corrections.judged_wrong(previous.rating, previous.check_verdict),
        reply.battle.scripted_corrections,
    )


@transaction.atomic
def rate_reply(*, battle: Battle, side: str, turn: int, rating: str | None) -> Message:
    """The voter's ✓ 🍄 🥦 🔥 on one reply (None clears it). 🥦 only answers a correction."""
    battle = _locked(battle)
    _refuse_if_closed(battle)
    _acted(battle)
    reply = Message.objects.filter(battle=battle, side=side, turn=turn, role=Message.Role.ASSISTANT).first()
    if reply is None:
        raise ArenaError("not_found", f"There is no reply on side {side.upper()} at turn {turn + 1}.")
    if not reply.is_finished or reply.status == Message.Status.FAILED:
        raise ArenaError("not_ready", "Only a finished reply can be rated.")
    if rating is not None and rating not in Rating.values:
        raise ArenaError("bad_frame", f"Unknown rating {rating!r}.")
    if rating == Rating.FIXED and not _answers_a_correction(reply):
        raise ArenaError("not_a_fix", "🥦 is for a reply that fixes a mistake: rate the earlier reply 🍄 or 🔥 first.")
    reply.rating = rating or ""
    reply.save(update_fields=["rating"])
    return reply


@transaction.atomic
def cast_vote(*, battle: Battle, choice: str, stage: str | None = None) -> Vote:
    """Store one stage's vote: first try (after the first replies), then after fix (after
    corrections). The models stay anonymous until the voter ends the battle."""
    battle = _locked(battle)
    _refuse_if_closed(battle)
    _acted(battle)
    if battle.mode == Battle.Mode.DIRECT:
        raise ArenaError("no_votes", "A direct chat has one model: there is nothing to vote on.")
    if choice not in Vote.Choice.values:
        raise ArenaError("bad_frame", f"Unknown vote choice {choice!r}.")
    if not Message.objects.filter(battle=battle, role=Message.Role.ASSISTANT).exists():
        raise ArenaError("not_ready", "Send a prompt and read both replies before voting.")
    if _has_unfinished_replies(battle):
        raise ArenaError("not_ready", "Wait until the replies are finished before voting.")
    first = battle.votes.filter(stage=Vote.Stage.FIRST_TRY).first()
    stage = stage or (Vote.Stage.AFTER_FIX if first else Vote.Stage.FIRST_TRY)
    last_turn = Message.objects.filter(battle=battle).aggregate(last=Max("turn"))["last"] or 0
    if stage == Vote.Stage.FIRST_TRY and first is not None:
        raise ArenaError("already_voted", "You have already voted on the first try.")
    if stage == Vote.Stage.AFTER_FIX:
        if first is None:
            raise ArenaError("vote_first", "Vote on the first try before voting after the fix.")
        if battle.votes.filter(stage=Vote.Stage.AFTER_FIX).exists():
            raise ArenaError("already_voted", "You have already voted after the fix.")
        if last_turn <= first.after_turn:
            raise ArenaError("not_ready", "Correct a side (or both) before voting after the fix.")
    try:
        with transaction.atomic():
            vote = Vote.objects.create(
                battle=battle,
                stage=stage,
                choice=choice,
                after_turn=last_turn,
                over_daily_cap=_over_daily_cap(battle),
            )
            record_seen_style(Vote.objects.filter(pk=vote.pk))
            return vote
    except IntegrityError:
        raise ArenaError("already_voted", "This stage already has a vote.") from None


def _over_daily_cap(battle: Battle) -> bool:
    """Whether the battle's voter or network has already cast the day's counted votes (UTC day;
    ARENA_VOTES_PER_VOTER_PER_DAY, ARENA_VOTES_PER_NETWORK_PER_DAY; 0: no cap).

    Such a vote is stored and answered as any other, and only the leaderboard leaves it out
    ("over daily cap"), as FastChat's limit_user_votes does: refusing it would tell an attacker
    exactly when the cap was hit, and with how many sessions or addresses to go on; kept, it
    costs them a vote that counts nowhere, and the detection still sees it. Votes on battles off
    the board (named, direct, excluded) are not counted against the cap."""
    if not battle.is_anonymous or battle.excluded:
        return False
    if connection.vendor == "postgresql":
        # Two votes of one voter (or network) in different battles at once would both see the
        # count below the cap: they take turns, until the vote's transaction ends (always voter
        # first, then network, so that they cannot deadlock).
        with connection.cursor() as cursor:
            for key in [f"voter:{battle.voter_key}"] + (
                [f"network:{battle.network_key}"] if battle.network_key else []
            ):
                cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"daily-cap:{key}"])
    day = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    counted = Vote.objects.filter(
        created__gte=day, over_daily_cap=False, battle__mode=Battle.Mode.ANONYMOUS, battle__excluded=False
    )
    caps = [(settings.ARENA_VOTES_PER_VOTER_PER_DAY, Q(battle__voter_key=battle.voter_key))]
    if battle.network_key:
        caps.append((settings.ARENA_VOTES_PER_NETWORK_PER_DAY, Q(battle__network_key=battle.network_key)))
    return any(cap > 0 and counted.filter(whose).count() >= cap for cap, whose in caps)


def record_seen_style(votes: QuerySet[Vote]) -> int:
    """Store on each vote the style of the replies its voter had seen (``Vote.seen_*``), in one
    update: what style control reads (leaderboard.selectors.style_outcomes)."""
    return votes.update(**selectors.seen_style())


@transaction.atomic
def end_battle(*, battle: Battle) -> Battle:
    """Close the battle and reveal the models; it needs at least the first-try vote."""
    battle = _locked(battle)
    _refuse_if_ended(battle)
    if _has_unfinished_replies(battle):
        raise ArenaError("not_ready", "Wait until the replies are finished (or stop them) before ending.")
    if battle.mode != Battle.Mode.DIRECT and not battle.votes.filter(stage=Vote.Stage.FIRST_TRY).exists():
        raise ArenaError("vote_first", "Say which side did better before the models are revealed.")
    battle.state = Battle.State.ENDED
    battle.ended = timezone.now()
    battle.ended_by = Battle.EndedBy.VOTER
    battle.share_id = new_public_id()
    battle.save(update_fields=["state", "ended", "ended_by", "share_id"])
    return battle


def keep_watching(*, battle: Battle) -> bool:
    """A page of the battle is open (or has just closed): its replies go on for at least
    ARENA_LEAVE_GRACE_SECONDS more. Returns whether the battle has ended meanwhile (the voter
    ended it on another page, or it was ended as idle), so that the page can show the reveal."""
    Battle.objects.filter(pk=battle.pk).update(seen_at=timezone.now())
    return Battle.objects.filter(pk=battle.pk, state=Battle.State.ENDED).exists()


@dataclass(frozen=True)
class IdleBattles:
    battles: int
    votes: int


def end_idle_battles() -> IdleBattles:
    """End the battles whose voter has voted and done nothing for ARENA_BATTLE_IDLE_SECONDS, so
    that their votes count. Battles with a reply still unfinished wait for it (a stalled one is
    failed by fail_stalled_replies). The names are shown when the voter comes back."""
    now = timezone.now()
    first_try = Vote.objects.filter(battle=OuterRef("pk"), stage=Vote.Stage.FIRST_TRY)
    unfinished = Message.objects.filter(battle=OuterRef("pk"), role=Message.Role.ASSISTANT).exclude(
        status__in=Message.FINISHED_STATUSES
    )
    with transaction.atomic():
        idle = list(
            Battle.objects.select_for_update(skip_locked=True)
            .filter(
                state=Battle.State.ACTIVE,
                last_action__lt=now - timedelta(seconds=settings.ARENA_BATTLE_IDLE_SECONDS),
            )
            .filter(Exists(first_try), ~Exists(unfinished))
            .values_list("pk", flat=True)
        )
        if not idle:
            return IdleBattles(battles=0, votes=0)
        for pk in idle:
            Battle.objects.filter(pk=pk).update(
                state=Battle.State.ENDED, ended=now, ended_by=Battle.EndedBy.IDLE, share_id=new_public_id()
            )
        return IdleBattles(battles=len(idle), votes=Vote.objects.filter(battle__in=idle).count())


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
    _acted(battle)
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


def claim_reply(message_id: int, attempt: int | None = None) -> str | None:
    """Claim a reply for generation. Returns its previous status ("pending", or "streaming" for
    a job redelivered after a worker was lost: it starts over), or None if there is nothing to
    do (finished, failed, stopped by the voter, gone, or retried since this job was queued)."""
    with transaction.atomic():
        replies = (
            Message.objects.select_for_update()
            .filter(pk=message_id, role=Message.Role.ASSISTANT, stop_requested=False)
            .filter(status__in=[Message.Status.PENDING, Message.Status.STREAMING])
        )
        if attempt is not None:
            replies = replies.filter(regenerations=attempt)
        reply = replies.first()
        if reply is None:
            return None
        previous = reply.status
        Message.objects.filter(pk=message_id).update(
            status=Message.Status.STREAMING,
            content="",
            delta_count=0,
            heartbeat=timezone.now(),
            first_token_at=None,
            # The database's clock, as hold_state reads it: both sides' pace waits from the later claim.
            claimed_at=Now(),
        )
    return previous


def save_partial_reply(message_id: int, *, content: str, delta_count: int) -> bool:
    """Persist the text streamed so far before its deltas are published, so reconnects resume.

    Returns False when the voter has asked to stop this reply (the worker should cancel it), or
    when it is no longer being generated (failed as stalled meanwhile).
    """
    return (
        Message.objects.filter(pk=message_id, status=Message.Status.STREAMING, stop_requested=False).update(
            content=content, delta_count=delta_count, heartbeat=timezone.now()
        )
        == 1
    )


def touch_reply(message_id: int) -> bool:
    """A generating worker's heartbeat (it also covers model loading and waiting for a slot).
    False once the reply is no longer being generated: it was stopped or failed as stalled.

    Here the reply is also stopped once every page of its battle has been gone for
    ARENA_LEAVE_GRACE_SECONDS (``Battle.seen_at``; a battle no page ever watched is left alone):
    the worker stops at its next flush, as for the voter's Stop."""
    now = timezone.now()
    generating = Message.objects.filter(pk=message_id, status=Message.Status.STREAMING, stop_requested=False)
    left_before = now - timedelta(seconds=settings.ARENA_LEAVE_GRACE_SECONDS)
    generating.filter(battle__seen_at__lt=left_before).update(stop_requested=True)
    return generating.update(heartbeat=now) == 1


def fail_unqueued_replies(message_ids: list[int]) -> list[FailedReply]:
    """Fail the pending replies whose jobs the broker refused (it is down): retried by the voter."""
    with transaction.atomic():
        replies = Message.objects.select_for_update(of=("self",)).filter(
            pk__in=message_ids, status=Message.Status.PENDING
        )
        return [_fail(reply, NOT_QUEUED) for reply in replies.select_related("battle")]


def fail_reply(message_id: int, error: str, attempt: int | None = None) -> FailedReply | None:
    """Fail a reply whose worker hit an error it could not finish the reply through (its
    database write failed, say): at once, so that the voter sees the error and Retry instead of
    waiting for the stall or queue limit. None if the reply is no longer this job's to fail
    (finished, stopped, retried since)."""
    with transaction.atomic():
        replies = Message.objects.select_for_update(of=("self",)).filter(
            pk=message_id,
            role=Message.Role.ASSISTANT,
            status__in=[Message.Status.PENDING, Message.Status.STREAMING],
        )
        if attempt is not None:
            replies = replies.filter(regenerations=attempt)
        reply = replies.select_related("battle").first()
        return _fail(reply, error) if reply is not None else None


def _fail(reply: Message, error: str) -> FailedReply:
    reply.error = error
    reply.status = Message.Status.FAILED
    reply.stop_reason = "error"
    reply.model_chars_per_s = None  # An earlier attempt's speed is not this one's.
    reply.save(update_fields=["status", "stop_reason", "error", "model_chars_per_s"])
    cause = FAILURE_CAUSES.get(error, metrics.WORKER_ERROR)
    transaction.on_commit(lambda: metrics.record_failure(cause))  # Counted once it is saved.
    logger.warning("Reply %s/%s turn %s failed: %s", reply.battle.public_id, reply.side, reply.turn, error)
    return FailedReply(
        battle_public_id=reply.battle.public_id,
        side=reply.side,
        turn=reply.turn,
        seq=reply.delta_count,
        text=reply.content,
        error=error,
    )


def stop_unfinished_replies() -> int:
    """End every reply still waiting or being written as stopped by a shutdown, keeping the text
    written so far; how many. For the embedded arena when it stops: its own threads were the
    only ones writing them, so none would ever finish (``votes.shutdown``)."""
    unfinished = Message.objects.filter(
        role=Message.Role.ASSISTANT, status__in=[Message.Status.PENDING, Message.Status.STREAMING]
    )
    return unfinished.update(status=Message.Status.STOPPED, stop_reason="shutdown", model_chars_per_s=None)


def fail_stalled_replies(*, battle: Battle | None = None) -> list[FailedReply]:
    """Fail the unfinished replies whose worker is gone, so that no voter waits forever.

    A reply being generated whose heartbeat is older than ``ARENA_REPLY_STALL_SECONDS`` lost its
    worker (killed, or cut off from the database); a pending one no worker took within
    ``ARENA_REPLY_QUEUE_SECONDS`` has no worker (none running, or the queue was lost with a
    Redis restart). Each is failed with a clear error the voter can retry from; the text shown so
    far is kept. If the lost job is delivered again later, it finds nothing to claim.
    """
    now = timezone.now()
    stall_limit = now - timedelta(seconds=settings.ARENA_REPLY_STALL_SECONDS)
    queue_limit = now - timedelta(seconds=settings.ARENA_REPLY_QUEUE_SECONDS)
    stalled = Q(status=Message.Status.STREAMING, heartbeat__lt=stall_limit)
    unclaimed = Q(status=Message.Status.PENDING, heartbeat__lt=queue_limit)
    with transaction.atomic():
        replies = Message.objects.select_for_update(skip_locked=True, of=("self",)).filter(
            stalled | unclaimed, role=Message.Role.ASSISTANT
        )
        if battle is not None:
            replies = replies.filter(battle=battle)
        return [
            _fail(reply, WORKER_LOST if reply.status == Message.Status.STREAMING else NOT_PICKED_UP)
            for reply in replies.select_related("battle")
        ]


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
    generation_ms: int | None = None,
    error: str = "",
    model_chars_per_s: float | None = None,
) -> bool:
    """Save a reply's final state, its automatic check (task battles) and any identity leak.

    Returns False, saving nothing, when the reply was failed as stalled meanwhile (its worker
    was cut off for longer than ``ARENA_REPLY_STALL_SECONDS``): the voter has been told already.
    """
    headers, lists, bold = style.markdown_counts(content)
    with transaction.atomic():
        updated = Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
            header_count=headers,
            list_count=lists,
            bold_count=bold,
            error=error,
            status=status,
            content=content,
            delta_count=delta_count,
            stop_reason=stop_reason,
            token_count=token_count,
            time_to_first_token_ms=time_to_first_token_ms,
            duration_ms=duration_ms,
            generation_ms=generation_ms,
            model_chars_per_s=model_chars_per_s,
        )
        if not updated:
            return False
        reply = Message.objects.select_related("battle__task", "battle__model_a", "battle__model_b").get(pk=message_id)
        review_reply(reply)
    model = reply.battle.model_on(reply.side)
    if model_chars_per_s is not None:
        speeds = selectors.recent_model_speeds(model, settings.ARENA_STREAM_PACE_SAMPLE)
        LLM.objects.filter(pk=model.pk).update(sustained_chars_per_s=pacing.sustained_speed(speeds))
    if time_to_first_token_ms is not None:
        waits = selectors.recent_first_token_ms(model, settings.ARENA_STREAM_PACE_SAMPLE)
        typical_s = pacing.typical_first_token_s(waits)
        LLM.objects.filter(pk=model.pk).update(typical_first_token_ms=None if typical_s is None else typical_s * 1000)
    return True


def review_reply(reply: Message) -> None:
    """Check a finished reply against its scripted turn, and flag a reply that names a model.

    A leak before the voter's first vote keeps the battle's votes but excludes them from the
    leaderboard, with the reason. A leak after it cannot void the votes already cast (a voter
    could otherwise make a model name itself to erase their own vote): they stay counted, and
    the battle takes no more prompts, votes or ratings (``Battle.close_after_vote``).
    """
    battle = reply.battle
    turn = battle.scripted_turn(reply.script_turn) if battle.task_id is not None else None
    if turn is not None and reply.status != Message.Status.FAILED:
        try:
            result = check_scripted(turn, reply.content)
        except CheckerConfigError:  # Admin validation refuses these; a bad turn must not lose the reply.
            logger.exception("Scripted turn %s of battle %s cannot be checked", reply.script_turn, battle)
            result = None
        if result is not None:
            reply.check_verdict = result.verdict
            reply.check_reason = result.reason
            reply.check_parts = dict(result.parts)
    leak = find_identity_leak(reply.content, (battle.model_a.name, battle.model_b.name))
    if leak:
        reply.identity_leak = leak[:100]
        reason = f"the reply of side {reply.side.upper()} at turn {reply.turn + 1} names {leak!r}"
        if battle.is_anonymous and battle.votes.exists():  # Cast blind: they stay counted.
            battle.close_after_vote(reason)
        else:
            battle.exclude(reason)
    reply.save(update_fields=["check_verdict", "check_reason", "check_parts", "identity_leak"])


# --- Tasks: import and export as JSON -------------------------------------------------------------

TASK_FIELDS = ("title", "category", "system_prompt", "context", "active", "notes")
TURN_FIELDS = ("prompt", "expected_output", "checker", "checker_options", "corrects_previous")


class TaskImportError(ValueError):
    """A task file that cannot be imported; the message says where and what is wrong."""


def _validated_task(index: int, data: Any) -> tuple[Task, list[TaskTurn]]:
    where = f"task {index + 1}"
    if not isinstance(data, dict):
        raise TaskImportError(f"{where}: expected an object with slug, title and turns.")
    where = f"task {data.get('slug') or index + 1!r}"
    unknown = set(data) - {"slug", "turns", *TASK_FIELDS}
    if unknown:
        raise TaskImportError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}.")
    task = Task(slug=data.get("slug") or "", **{name: data[name] for name in TASK_FIELDS if name in data})
    try:
        task.full_clean(validate_unique=False)
    except ValidationError as error:
        raise TaskImportError(f"{where}: {_messages(error)}") from None
    turns_data = data.get("turns")
    if not isinstance(turns_data, list) or not turns_data:
        raise TaskImportError(f"{where}: needs a non-empty list of turns.")
    turns = []
    for position, turn_data in enumerate(turns_data):
        turn_where = f"{where}, turn {position + 1}"
        if not isinstance(turn_data, dict):
            raise TaskImportError(f"{turn_where}: expected an object with prompt and expected_output.")
        unknown = set(turn_data) - set(TURN_FIELDS)
        if unknown:
            raise TaskImportError(f"{turn_where}: unknown field(s) {', '.join(sorted(unknown))}.")
        turn = TaskTurn(task=task, position=position, **turn_data)
        try:
            turn.full_clean(exclude=["task"], validate_unique=False, validate_constraints=False)
        except ValidationError as error:
            raise TaskImportError(f"{turn_where}: {_messages(error)}") from None
        turns.append(turn)
    return task, turns


def _messages(error: ValidationError) -> str:
    if hasattr(error, "message_dict"):
        return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in error.message_dict.items())
    return " ".join(error.messages)


@transaction.atomic
def import_tasks(data: Any, *, keep_existing: bool = False) -> list[Task]:
    """Create or replace tasks (matched by slug) from the JSON of ``export_tasks``.

    Everything is validated before anything is written: a file with one bad turn changes
    nothing. ``keep_existing`` leaves tasks whose slug exists untouched (an admin's edits win).
    """
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        raise TaskImportError('Expected a JSON object {"tasks": [...]}.')
    parsed = [_validated_task(index, item) for index, item in enumerate(data["tasks"])]
    slugs = [task.slug for task, _ in parsed]
    duplicates = sorted({slug for slug in slugs if slugs.count(slug) > 1})
    if duplicates:
        raise TaskImportError(f"Slug(s) given twice: {', '.join(duplicates)}.")
    imported = []
    for task, turns in parsed:
        existing = Task.objects.filter(slug=task.slug).first()
        if existing is not None and keep_existing:
            continue
        if existing is not None:
            for name in TASK_FIELDS:
                setattr(existing, name, getattr(task, name))
            existing.save()
            existing.turns.all().delete()
            task = existing
        else:
            task.save()
        for turn in turns:
            turn.task = task
        TaskTurn.objects.bulk_create(turns)
        imported.append(task)
    return imported


@transaction.atomic
def duplicate_task(task: Task) -> Task:
    """A copy of the task and its turns, inactive, under a free slug ("calendar-copy-2")."""
    slug = selectors.free_task_slug(f"{task.slug[:50]}-copy")
    copy = Task.objects.create(
        slug=slug,
        title=f"{task.title} (copy)"[:200],
        category=task.category,
        system_prompt=task.system_prompt,
        context=task.context,
        active=False,
        notes=task.notes,
    )
    TaskTurn.objects.bulk_create(
        TaskTurn(task=copy, **{name: getattr(turn, name) for name in ("position", *TURN_FIELDS)})
        for turn in task.turns.all()
    )
    return copy


@transaction.atomic
def promote_fix_episode(
    episode: FixEpisode,
    *,
    slug: str,
    title: str,
    expected_output: str,
    checker: str,
    checker_options: dict[str, Any] | None = None,
    active: bool = True,
) -> Task:
    """A curated task from a battle's corrected turn (the dynamic benchmark): the conversation
    of that side up to the wrong reply becomes the task's context, handed to both models as their
    own, and the correction its first scripted prompt, checked against the expected output the
    admin writes. Raises ValidationError, saying what is wrong, and writes nothing, for an
    evaluation run's episode, a reply that names a model, or an invalid task."""
    battle = episode.battle
    if battle is None:
        raise ValidationError("Only a live battle's episode can be promoted (evaluation runs replay tasks already).")
    history = selectors.episode_history(episode)
    if any(message.identity_leak for message in history):
        raise ValidationError("A reply of this conversation names a model: it cannot be shown to voters.")
    source = battle.task
    task = Task(
        slug=slug,
        title=title,
        category=source.category if source else "",
        system_prompt=source.system_prompt if source else "",
        context=[
            *(source.context if source else []),
            *({"role": message.role, "content": message.content} for message in history),
        ],
        active=active,
        notes=(
            f"Promoted from battle {battle.public_id}, side {episode.side.upper()}, turn {episode.wrong_turn + 1}: "
            f"{episode.model} was told {episode.correction!r} and {'fixed' if episode.fixed else 'did not fix'} it."
        ),
    )
    task.full_clean()
    turn = TaskTurn(
        task=task,
        position=0,
        prompt=episode.correction,
        expected_output=expected_output,
        checker=checker,
        checker_options=checker_options or {},
        corrects_previous=True,
    )
    turn.full_clean(exclude=["task"], validate_unique=False, validate_constraints=False)
    task.save()
    turn.task = task
    turn.save()
    return task


# --- Researcher API keys -----------------------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_researcher_key(name: str) -> tuple[ResearcherKey, str]:
    """A new key: the token is returned once, only its hash is stored."""
    token = "fxa_" + secrets.token_urlsafe(32)
    key = ResearcherKey.objects.create(name=name, prefix=token[:10], key_hash=hash_token(token))
    return key, token


def researcher_key_for(token: str) -> ResearcherKey | None:
    key = ResearcherKey.objects.filter(key_hash=hash_token(token)).first()
    if key is not None and not key.revoked:
        ResearcherKey.objects.filter(pk=key.pk).update(last_used=timezone.now())
    return key


@transaction.atomic
def record_fix_episodes(*, battle_ids: Sequence[int] | None = None) -> int:
    """Record the fix episodes of ended battles (ratings can change until a battle ends, not
    after) and of every finished evaluation run; returns how many were written.

    ``battle_ids``: only those battles' are read, their episodes replaced (a refresh passes the
    battles ended since the last one, so that the work does not grow with the arena); None
    rebuilds every ended battle's (the first refresh, or after a task's correction turns or a
    counted battle changed in the admin)."""
    battles = Battle.objects.filter(state=Battle.State.ENDED)
    stale = FixEpisode.objects.filter(battle__isnull=False)
    if battle_ids is not None:
        battles, stale = battles.filter(pk__in=battle_ids), stale.filter(battle_id__in=battle_ids)
    episodes = selectors.fix_episodes(battles) + selectors.evaluation_fix_episodes()
    stale.delete()
    FixEpisode.objects.filter(evaluation_run__isnull=False).delete()  # Few: always rebuilt.
    FixEpisode.objects.bulk_create(episodes)
    return len(episodes)
