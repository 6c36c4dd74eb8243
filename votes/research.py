"""Research data: votes as records compatible with the public arena's clean_battle dumps.

Reads only (selectors for the research API and export_dump). A record is one vote: the
clean_battle fields (question_id, model_a, model_b, winner, judge, conversation_a,
conversation_b, turn, anony, language, tstamp) and this arena's own (stage, corrections,
ratings, checker verdicts, task, exclusion). No IP address or session key ever appears: the
judge is a keyed hash of the voter, stable across exports.
"""

import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet

from inference.models import LLM
from leaderboard import style
from leaderboard.selectors import counted_votes, every_counted_vote, in_category, voter_flag_reason
from votes.models import Battle, FixEpisode, Message, Vote
from votes.selectors import research_script

WINNERS = {"a": "model_a", "b": "model_b", "tie": "tie", "both_bad": "tie (bothbad)"}


def judge_id(voter_key: str) -> str:
    """A stable pseudonym of the voter: HMAC with a server secret (ARENA_JUDGE_SECRET)."""
    secret = settings.ARENA_JUDGE_SECRET.encode()
    return "judge-" + hmac.new(secret, f"judge:{voter_key}".encode(), hashlib.sha256).hexdigest()[:20]


def research_votes(
    *,
    category: str = "overall",
    include_excluded: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Vote]:
    """The votes of a category: those the leaderboard counts, or every one (then with the
    reason each would be left out), of ended battles only: a battle still in progress has its
    names hidden from its voter, so its votes reach no one with them."""
    votes = in_category(Vote.objects.all(), category) if include_excluded else counted_votes(category)
    votes = votes.filter(battle__state=Battle.State.ENDED)
    if since is not None:
        votes = votes.filter(battle__ended__gte=since)
    if until is not None:
        votes = votes.filter(battle__ended__lt=until)
    return _for_records(votes)


def _for_records(votes: QuerySet[Vote]) -> QuerySet[Vote]:
    """With what vote_record reads: one query per chunk of votes, not per vote."""
    return (
        votes.annotate(voter_flag_reason=voter_flag_reason())
        .select_related("battle__model_a", "battle__model_b", "battle__task")
        .prefetch_related("battle__messages")
    )


def newest_sample(votes: QuerySet[Vote], size: int) -> QuerySet[Vote]:
    """The ``size`` newest of ``votes``, oldest first."""
    newest = list(votes.order_by("-pk").values_list("pk", flat=True)[:size])
    return votes.filter(pk__in=newest).order_by("pk")


def anonymous_sample(votes: QuerySet[Vote], pool: int, size: int) -> QuerySet[Vote]:
    """The anonymous API's sample: of ``votes``, those among the ``pool`` newest counted votes of
    any stage and category, the ``size`` newest of them, oldest first. The pool comes first, so
    it is a true cap: no time window or category, walked one after another, reaches older
    votes."""
    newest = list(every_counted_vote().order_by("-pk").values_list("pk", flat=True)[:pool])
    return newest_sample(votes.filter(pk__in=newest), size)


def page_after(votes: QuerySet[Vote], cursor: int | None, size: int) -> tuple[QuerySet[Vote], int | None]:
    """The next ``size`` votes after the vote id ``cursor``, and the cursor of the page after
    (None on the last page)."""
    if cursor is not None:
        votes = votes.filter(pk__gt=cursor)
    ids = list(votes.order_by("pk").values_list("pk", flat=True)[: size + 1])
    next_cursor = ids[size - 1] if len(ids) > size else None
    return votes.filter(pk__in=ids[:size]).order_by("pk"), next_cursor


def ended_battles_page(cursor: str | None, size: int) -> tuple[list[Battle], str | None]:
    """Ended battles after the one whose id is ``cursor``; raises Battle.DoesNotExist for an
    unknown cursor."""
    battles = Battle.objects.filter(state=Battle.State.ENDED).order_by("pk")
    if cursor is not None:
        battles = battles.filter(pk__gt=Battle.objects.get(public_id=cursor).pk)
    page = list(battles.select_related("model_a", "model_b", "task")[: size + 1])
    return page[:size], page[size - 1].public_id if len(page) > size else None


def ended_battle(public_id: str) -> Battle | None:
    return (
        Battle.objects.filter(public_id=public_id, state=Battle.State.ENDED)
        .select_related("model_a", "model_b", "task")
        .first()
    )


def all_votes() -> QuerySet[Vote]:
    """Every vote of every stage of the ended battles, oldest first, with what vote_record
    reads (a battle still in progress is left out of research data, see research_votes)."""
    return _for_records(Vote.objects.filter(battle__state=Battle.State.ENDED).order_by("pk"))


def exclusion_reason(vote: Vote) -> str | None:
    battle = vote.battle
    if not battle.is_anonymous:
        return battle.excluded_reason or f"{battle.mode} mode"
    if battle.excluded:
        return f"identity leak: {battle.excluded_reason}"
    reason = getattr(vote, "voter_flag_reason", None)
    if reason:
        return f"flagged voter: {reason}"
    if vote.over_daily_cap:
        return "over daily cap: the voter or their network had cast the day's counted votes"
    if battle.state != Battle.State.ENDED:
        return "unfinished battle"
    return None


def _conversations(battle: Battle, through_turn: int) -> dict[str, Any]:
    """Per side, the conversation the voter had seen, and the corrections sent to one side."""
    # From the prefetched messages of the battle: in turn order, the prompt before the reply.
    messages = sorted(
        (m for m in battle.messages.all() if m.turn <= through_turn),
        key=lambda m: (m.turn, m.role != Message.Role.USER, m.side),
    )
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
                    # Why it ended: stop (its model), length or time (its cap: cut), cancelled,
                    # shutdown or error.
                    "stop_reason": message.stop_reason or None,
                    "cut": message.cut,
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
        # The style fields of LMArena's releases, for style control (rate_battles --style-control).
        "conv_metadata": style.conv_metadata(
            *(
                [(m["content"], m["num_tokens"]) for m in seen["conversation"][side] if m["role"] == "assistant"]
                for side in "ab"
            )
        ),
        "anony": battle.is_anonymous,
        "language": "unknown",
        "tstamp": moment.timestamp(),
        # This arena's own fields.
        "vote_id": vote.pk,
        "battle_id": battle.public_id,
        "stage": vote.stage,
        "mode": battle.mode,
        "after_turn": vote.after_turn,
        "corrections": seen["corrections"],
        "ratings_a": seen["ratings"]["a"],
        "ratings_b": seen["ratings"]["b"],
        "task": battle.task.slug if battle.task else None,
        "task_category": battle.task.category if battle.task else None,
        "system_prompt": battle.system_prompt if battle.task_id else None,
        "context": battle.context if battle.task_id else None,
        "script": research_script(battle),
    }
    if with_exclusion:
        reason = exclusion_reason(vote)
        record["excluded"] = reason is not None
        record["excluded_reason"] = reason
    return record


def vote_records(votes: QuerySet[Vote], *, with_exclusion: bool = False) -> Iterator[dict[str, Any]]:
    for vote in votes.iterator(chunk_size=500):
        yield vote_record(vote, with_exclusion=with_exclusion)


def without_arena_texts(record: dict[str, Any], in_arena: frozenset[str] | set[str]) -> dict[str, Any]:
    """A vote record for the anonymous sample: the replies of a side whose model is in the arena
    (enabled on the roster), and the checker's reasons that quote them, withheld (null), with
    ``texts_hidden`` listing those sides. Its name, votes, verdicts, ratings and token counts
    stay. Published with its name, every such text teaches a voter how that model writes, and a
    probe that matched fresh battles against 20 of them named both models in 50 of 50
    (tests/test_identification_probe.py); researchers with a key still get every text."""
    hidden = [side for side in "ab" if record[f"model_{side}"] in in_arena]
    shown = dict(record)
    for side in hidden:
        shown[f"conversation_{side}"] = [
            {**turn, "content": None} if turn["role"] == Message.Role.ASSISTANT else turn
            for turn in record[f"conversation_{side}"]
        ]
        shown[f"ratings_{side}"] = [{**rating, "check_reason": None} for rating in record[f"ratings_{side}"]]
    shown["texts_hidden"] = hidden
    return shown


def flat_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record for a flat format (CSV, Parquet): nested fields as JSON text."""
    return {k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in record.items()}


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
    "mode",
    "after_turn",
    "task",
    "task_category",
    "conversation_a",
    "conversation_b",
    "conv_metadata",
    "corrections",
    "ratings_a",
    "ratings_b",
    "system_prompt",
    "context",
    "script",
    "excluded",
    "excluded_reason",
)


def episode_records(
    *, include_excluded: bool = False, after: int = 0, limit: int | None = None
) -> list[dict[str, Any]]:
    """The stored fix episodes (of ended battles, and of finished evaluation runs) as records,
    oldest first, after the episode id ``after``: those not left out, or every one with the reason
    it would be (a battle's identity leak or flagged voter). ``rate_fixes`` reads these records
    as they are; the live board rates the battles' episodes only."""
    episodes = FixEpisode.objects.filter(pk__gt=after).annotate(voter_flag_reason=voter_flag_reason())
    if not include_excluded:
        episodes = episodes.filter(Q(battle__isnull=True) | Q(battle__excluded=False), voter_flag_reason__isnull=True)
    episodes = episodes.select_related("battle", "model", "task", "mistake_by").order_by("pk")
    records = []
    in_arena = set(LLM.objects.filter(enabled=True).values_list("name", flat=True))
    for episode in episodes[:limit] if limit else episodes:
        reason = None
        if episode.battle is not None and episode.battle.excluded:
            reason = f"identity leak: {episode.battle.excluded_reason}"
        elif episode.voter_flag_reason is not None:
            reason = f"flagged voter: {episode.voter_flag_reason}"
        records.append(
            {
                "episode_id": episode.pk,
                "battle": episode.battle.public_id if episode.battle else None,
                "evaluation_run": episode.evaluation_run_id,
                "model": episode.model.name,
                "mistake_by": episode.mistake_by.name if episode.mistake_by else None,
                "task": episode.task.slug if episode.task else "free chat",
                "turn": episode.script_turn if episode.script_turn is not None else 0,
                "wrong_turn": episode.wrong_turn,
                "side": episode.side,
                "attempt": episode.attempt,
                "correction": None if _quotes_arena_reply(episode, in_arena) else episode.correction,
                "source": episode.source,
                "feedback_kind": episode.specificity,
                "fixed": episode.fixed,
                "turns_to_fix": episode.turns_to_fix,
                "regression": episode.regression,
                "persisted": episode.persisted,
                "voter_fixed": episode.voter_fixed,
                "checker_fixed": episode.checker_fixed,
                "decoy": False,
                "excluded": reason is not None,
                "excluded_reason": reason,
            }
        )
    return records


def _quotes_arena_reply(episode: FixEpisode, in_arena: set[str]) -> bool:
    """An evaluation run's correction written from the checker's reason quotes the wrong reply
    (votes.evaluation.published): withheld while the model that wrote that reply (the one that
    made the mistake) is in the arena. A battle's corrections are the voter's own words."""
    if episode.evaluation_run_id is None or episode.source != FixEpisode.Source.CHECKER:
        return False
    author = episode.mistake_by if episode.mistake_by is not None else episode.model
    return author.name in in_arena
