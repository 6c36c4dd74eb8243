"""Reads for battles: what a voter may see, and what a generation job needs."""

import functools
import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Count, FloatField, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Cast, Coalesce, Length, Now
from django.utils import timezone

from inference import context_budget, readiness
from inference.models import LLM
from leaderboard import fixing, style
from votes import corrections, evaluation, feedback
from votes.checkers import CheckerConfigError
from votes.models import (
    Battle,
    EvaluationRun,
    FixEpisode,
    Message,
    Task,
    TaskTurn,
    Vote,
    check_scripted,
)
from votes.pairing import Candidate


def pairing_candidates(*, with_ratings: bool = False) -> list[Candidate]:
    """The models an anonymous battle may draw, as pair sampling sees them: weight, battles so
    far, overall rating (from the latest leaderboard refresh; only if ``with_ratings``). Only
    enabled models that sample (a greedy one's replies are a lookup table that names it:
    inference.models.GREEDY_NOTE) and whose context holds the arena's longest conversation (a
    refusal for length would otherwise come with some pairs only: inference.models.CONTEXT_NOTE),
    and, while ``ARENA_READY_MODELS_ONLY``, warm on a live host (inference.readiness)."""
    models = list(LLM.objects.anonymous())
    if readiness.required():
        ready = readiness.ready_names(model.name for model in models)
        models = [model for model in models if model.name in ready]
    battles: Counter[int] = Counter()
    for side in ("model_a", "model_b"):
        for row in Battle.objects.filter(mode=Battle.Mode.ANONYMOUS).values(side).annotate(n=Count("id")):
            battles[row[side]] += row["n"]
    ratings: dict[str, float] = {}
    if with_ratings:
        from leaderboard.selectors import latest_refresh  # The leaderboard reads votes; not the reverse.

        refresh = latest_refresh()
        overall = refresh.snapshots.filter(category="overall").first() if refresh else None
        # Only ratings the votes settle: a model of another comparison group, or with an open end
        # (its row shows a bound, not an estimate), is sampled as one not rated yet.
        ratings = {
            row["model"]: row["rating"]
            for row in (overall.rows if overall else [])
            if row.get("group", 1) == 1 and not row.get("lower_open") and not row.get("upper_open")
        }
    return [
        Candidate(id=m.pk, weight=m.sampling_weight, battles=battles[m.pk], rating=ratings.get(m.name)) for m in models
    ]


def pair_vote_counts() -> dict[frozenset[int], int]:
    """Votes cast so far per unordered pair of models."""
    counts: Counter[frozenset[int]] = Counter()
    anonymous = Vote.objects.filter(battle__mode=Battle.Mode.ANONYMOUS)
    for row in anonymous.values("battle__model_a", "battle__model_b").annotate(n=Count("id")):
        counts[frozenset((row["battle__model_a"], row["battle__model_b"]))] += row["n"]
    return dict(counts)


def battle_group(public_id: str) -> str:
    """The channel-layer group that carries one battle's frames."""
    return f"battle.{public_id}"


def shared_battle(share_id: str) -> Battle | None:
    """An ended battle by its share id: its share page is public, read-only."""
    return (
        Battle.objects.select_related("model_a", "model_b", "task")
        .filter(share_id=share_id, state=Battle.State.ENDED)
        .first()
    )


RATING_WORDS = {"correct": "✓ correct", "mistake": "🍄 mistake", "fixed": "🥦 fixed", "garbage": "🔥 garbage"}


def shared_battle_page(battle: Battle) -> dict[str, Any]:
    """What a battle's share page shows: per side, its model and its exchanges (prompt, reply,
    the voter's rating in words, the automatic check), and the votes in words."""
    state = battle_state(battle)
    sides = [
        {
            "side": side,
            "model": name,
            "exchanges": [
                {
                    "prompt": turn["prompt"],
                    "reply": turn["replies"][side],
                    "rating": RATING_WORDS.get(turn["replies"][side]["rating"] or ""),
                }
                for turn in state["turns"]
                if side in turn["replies"]
            ],
        }
        for side, name in (state["models"] or {}).items()
    ]
    choices = dict(Vote.Choice.choices)
    votes = {stage: choices[choice] for stage, choice in state["votes"].items()}
    return {"mode": battle.mode, "sides": sides, "votes": votes, "models": state["models"] or {}}


def chat_models() -> list[tuple[str, readiness.ModelState]]:
    """The enabled models' names and states, for the voter to pick from in named mode and direct
    chat (a model not ready yet is shown, and cannot be picked while ready models only are used)."""
    names = list(LLM.objects.enabled().order_by("name").values_list("name", flat=True))
    states = readiness.states(names)
    return [(name, states[name]) for name in names]


@dataclass(frozen=True)
class RosterStatus:
    """How many of the anonymous roster's models are ready, for the arena page (no names)."""

    ready: int
    warming: int  # Loading now.
    failed: int  # Their hosts could not load them: out of the draw until that changes.
    total: int
    required: bool  # Battles use ready models only (ARENA_READY_MODELS_ONLY).

    @property
    def needed(self) -> int:
        """Ready models an anonymous battle needs: ARENA_MIN_READY_MODELS (3), or every model
        not failed where fewer are left, and at least two. Which models are ready is public:
        with only two ready out of more, every battle's pair would be known."""
        return max(2, min(settings.ARENA_MIN_READY_MODELS, self.total - self.failed))

    @property
    def battles_possible(self) -> bool:
        return not self.required or self.ready >= self.needed


def roster_status() -> RosterStatus:
    names = list(LLM.objects.anonymous().values_list("name", flat=True))
    states = readiness.states(names).values()
    return RosterStatus(
        ready=sum(state.ready for state in states),
        warming=sum(state.state is readiness.State.LOADING for state in states),
        failed=sum(state.state is readiness.State.FAILED for state in states),
        total=len(names),
        required=readiness.required(),
    )


def battle_for_voter(*, public_id: str, voter_key: str) -> Battle | None:
    """The battle if it belongs to this voter; None otherwise, so ids of others reveal nothing."""
    return (
        Battle.objects.select_related("model_a", "model_b", "task")
        .filter(public_id=public_id, voter_key=voter_key)
        .first()
    )


def battle_state(battle: Battle) -> dict[str, Any]:
    """The full state frame a (re)connecting client rebuilds its view from.

    Model names, the automatic checks and any exclusion are included only once the voter has
    ended the battle (Battle.reveal()): before, they could hint at which model is which.
    """
    ended = battle.is_ended
    votes = list(battle.votes.all())
    turns: dict[int, dict[str, Any]] = {}
    scripted: dict[tuple[int, str], int | None] = {}
    for message in Message.objects.filter(battle=battle).order_by("turn", "side", "role"):
        turn = turns.setdefault(
            message.turn, {"turn": message.turn, "prompt": "", "sides": [], "corrects": [], "replies": {}}
        )
        if message.role == Message.Role.USER:
            turn["prompt"] = message.content
            turn["sides"].append(message.side)
            scripted[message.turn, message.side] = message.script_turn
            continue
        turn["replies"][message.side] = reply_state(message, reveal=ended)
    direct = battle.mode == Battle.Mode.DIRECT  # One side, none that waits: no voter's correction.
    for turn in turns.values():
        # The sides on which this prompt corrects the reply before, should that be judged wrong:
        # only there does the page offer 🥦 on its answer (votes.corrections).
        turn["corrects"] = [
            side
            for side in turn["sides"]
            if corrections.may_correct(
                corrections.Prompt(
                    turn["prompt"], scripted[turn["turn"], side], len(turn["sides"]) == 1 and not direct
                ),
                battle.scripted_corrections,
            )
        ]
    return {
        "type": "state",
        "battle": battle.public_id,
        "task": battle_task_summary(battle) if battle.task_id else None,
        "turns": [turns[index] for index in sorted(turns)],
        "votes": {vote.stage: vote.choice for vote in votes},
        "first_try_turn": next((vote.after_turn for vote in votes if vote.stage == "first_try"), None),
        "mode": battle.mode,
        "ended": ended,
        "ended_by": battle.ended_by or None if ended else None,
        "share": f"/share/{battle.share_id}/" if ended and battle.share_id else None,
        "models": battle.reveal(),
        "excluded": battle.excluded_reason if ended and battle.excluded else None,
    }


def empty_state() -> dict[str, Any]:
    """The state frame of a page with no battle yet, listing the tasks a voter can start on."""
    return {
        "type": "state",
        "battle": None,
        "task": None,
        "tasks": [{"slug": task.slug, "title": task.title, "category": task.category} for task in active_tasks()],
        "turns": [],
        "votes": {},
        "first_try_turn": None,
        "mode": None,
        "ended": False,
        "ended_by": None,
        "share": None,
        "models": None,
        "excluded": None,
    }


def reply_state(message: Message, *, reveal: bool) -> dict[str, Any]:
    state: dict[str, Any] = {
        "status": message.status,
        "text": message.content,
        "cut": message.cut,
        "seq": message.delta_count,
        "rating": message.rating or None,
        "stats": (
            reply_stats(
                tokens=message.token_count or 0,
                ttft_ms=message.time_to_first_token_ms,
                duration_ms=message.duration_ms or 0,
            )
            # Speed and token counts would tell the models apart: shown once they are revealed.
            if reveal and message.status in (Message.Status.DONE, Message.Status.STOPPED)
            else {}
        ),
    }
    if message.status == Message.Status.FAILED:
        state["error"] = message.error or "This reply could not be generated."
    if reveal:
        state["check"] = (
            {"verdict": message.check_verdict, "reason": message.check_reason} if message.check_verdict else None
        )
    return state


def task_summary(task: Task) -> dict[str, Any]:
    """What a voter sees of a task: its system prompt and its scripted prompts (suggestions)."""
    return {
        "slug": task.slug,
        "title": task.title,
        "category": task.category,
        "system_prompt": task.system_prompt,
        "context": task.context,
        "suggestions": [turn.prompt for turn in task.turns.order_by("position")],
    }


def battle_task_summary(battle: Battle) -> dict[str, Any]:
    """``task_summary`` of a battle's task as its models were given it (Battle.script)."""
    return task_summary(battle.task) | {
        "system_prompt": battle.system_prompt,
        "context": battle.context,
        "suggestions": [turn["prompt"] for turn in battle.script],
    }


def active_tasks() -> list[Task]:
    return list(Task.objects.active().order_by("title"))


def task_by_slug(slug: str) -> Task | None:
    return Task.objects.active().filter(slug=slug).first()


def reply_stats(*, tokens: int, ttft_ms: int | None, duration_ms: int) -> dict[str, Any]:
    """The stats shown under a finished reply once the battle is revealed (state frames)."""
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
    system_prompt: str | None
    # (role, content) pairs of this side's conversation up to and including the prompt to answer.
    conversation: list[tuple[str, str]]
    pace_chars_per_s: float | None  # The battle's pace; None: the site's.
    # The other side's reply to the same prompt (a turn sent to both sides), or None.
    partner_reply_id: int | None
    # Seconds after the worker starts before the reply's pace may start (anonymous battles).
    first_text_lead_s: float = 0.0
    # Seconds the reply may take (reply_seconds_cap).
    max_reply_seconds: float = 60.0


def slower_generation_seconds(public_id: str) -> float | None:
    """The longest of a battle's replies' own generation times (``Message.generation_ms``), in
    seconds; None for an unknown battle or one whose replies have none recorded."""
    times = Message.objects.filter(
        battle__public_id=public_id, role=Message.Role.ASSISTANT, generation_ms__isnull=False
    ).values_list("generation_ms", flat=True)
    return max(times) / 1000 if times else None


def slowest_model_seconds(public_id: str) -> float | None:
    """What the slowest model anonymous battles may draw needs for the battle's longer reply: its
    median time to first token plus the reply's characters at its median speed, over its last
    ``ARENA_STREAM_PACE_SAMPLE`` replies, those the pace reads (the slowest: the one needing
    longest). Every model anonymous battles may draw, ready or not: readiness lives in the
    serving process's cache, which a benchmark's process may not share. None for an unknown
    battle, one without a reply, or where no model has been measured yet."""
    lengths = Message.objects.filter(battle__public_id=public_id, role=Message.Role.ASSISTANT).values_list(
        Length("content"), flat=True
    )
    if not lengths:
        return None
    longest = max(lengths)
    sample = settings.ARENA_STREAM_PACE_SAMPLE
    needs = []
    for candidate in LLM.objects.anonymous():
        speeds, first_ms = recent_model_speeds(candidate, sample), recent_first_token_ms(candidate, sample)
        if speeds and first_ms:
            needs.append(statistics.median(first_ms) / 1000 + longest / statistics.median(speeds))
    return max(needs, default=None)


def recent_model_speeds(model: LLM, limit: int) -> list[float]:
    """The model's own speeds (characters a second, before pacing) on its last ``limit`` replies."""
    replies = Message.objects.filter(role=Message.Role.ASSISTANT, model_chars_per_s__isnull=False).filter(
        Q(side="a", battle__model_a=model) | Q(side="b", battle__model_b=model)
    )
    return list(replies.order_by("-pk").values_list("model_chars_per_s", flat=True)[:limit])


def recent_first_token_ms(model: LLM, limit: int) -> list[float]:
    """The model's times to its first token (milliseconds) on its last ``limit`` replies."""
    replies = Message.objects.filter(role=Message.Role.ASSISTANT, time_to_first_token_ms__isnull=False).filter(
        Q(side="a", battle__model_a=model) | Q(side="b", battle__model_b=model)
    )
    return [float(ms) for ms in replies.order_by("-pk").values_list("time_to_first_token_ms", flat=True)[:limit]]


@dataclass(frozen=True)
class HoldState:
    """What a side holding its first text needs to know, read in one query: how long ago the
    other side's model produced its first text (None: not yet; measured by the database's clock,
    as it was recorded, so hosts' clocks never matter), whether the other side is over, whether
    the voter has asked to stop this reply, how long ago the later of the two sides' workers
    started on them (None: the other side's has not yet; by the same clock), and how long ago
    this side's own first text was recorded (None: not yet; by the same clock)."""

    partner_started_s_ago: float | None
    partner_finished: bool
    stop_requested: bool
    later_claim_s_ago: float | None = None
    own_started_s_ago: float | None = None


def hold_state(message_id: int, partner_id: int) -> HoldState:
    rows = {
        row["pk"]: row
        for row in Message.objects.filter(pk__in=[message_id, partner_id])
        .annotate(now=Now())
        .values("pk", "first_token_at", "claimed_at", "status", "stop_requested", "now")
    }
    own, partner = rows.get(message_id), rows.get(partner_id)
    if partner is None:  # Gone with its battle: nothing to wait for.
        return HoldState(None, True, own is None or own["stop_requested"])
    now = partner["now"]

    def seconds_ago(moment: Any) -> float | None:
        return None if moment is None else max(0.0, (now - moment).total_seconds())

    claims = [row["claimed_at"] for row in (own, partner) if row is not None]
    later_claim = max(claims) if len(claims) == 2 and None not in claims else None
    return HoldState(
        partner_started_s_ago=seconds_ago(partner["first_token_at"]),
        partner_finished=partner["status"] in Message.FINISHED_STATUSES,
        stop_requested=own is None or own["stop_requested"],
        later_claim_s_ago=seconds_ago(later_claim),
        own_started_s_ago=None if own is None else seconds_ago(own["first_token_at"]),
    )


def conversation_size(battle: Battle, side: str, prompt: str) -> int:
    """The size of ``side``'s conversation with ``prompt`` added, as the arena counts it
    (inference.context_budget): everything its model would be given for the next reply, as
    ``generation_context`` gathers it."""
    history = Message.objects.filter(battle=battle, side=side).order_by("turn", "-role")
    texts = list(history.values_list("content", flat=True))
    if battle.task_id is None:
        return context_budget.conversation_size(None, [*texts, prompt])
    context = [item["content"] for item in battle.context]
    return context_budget.conversation_size(battle.system_prompt, [*context, *texts, prompt])


def generation_context(message_id: int) -> GenerationContext | None:
    reply = (
        Message.objects.select_related("battle__model_a", "battle__model_b", "battle__task")
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
    battle = reply.battle
    if battle.task_id is not None:  # A promoted mistake: handed to the model as its own.
        conversation = [(item["role"], item["content"]) for item in battle.context] + conversation
    partner = (
        Message.objects.filter(battle=reply.battle, turn=reply.turn, role=Message.Role.ASSISTANT)
        .exclude(side=reply.side)
        .values_list("pk", flat=True)
        .first()
    )
    return GenerationContext(
        message_id=reply.pk,
        battle_public_id=reply.battle.public_id,
        side=reply.side,
        turn=reply.turn,
        model=reply.battle.model_on(reply.side),
        seed=reply.seed or 0,
        system_prompt=battle.system_prompt if battle.task_id is not None else None,
        conversation=conversation,
        pace_chars_per_s=reply.battle.pace_chars_per_s,
        partner_reply_id=partner,
        first_text_lead_s=battle.first_text_lead_s or 0.0,
        max_reply_seconds=reply_seconds_cap(battle, reply.battle.model_on(reply.side)),
    )


def reply_seconds_cap(battle: Battle, model: LLM) -> float:
    """The seconds a reply may take: its model's cap, within ARENA_MAX_REPLY_SECONDS. In an
    anonymous battle the arena's instead, the least cap of the models it may draw: a reply cut
    sooner with some models than with others would name them."""
    if battle.mode == Battle.Mode.ANONYMOUS:
        caps = LLM.objects.anonymous().values_list("max_reply_seconds", flat=True)
        own = min(caps, default=model.max_reply_seconds)
    else:
        own = model.max_reply_seconds
    return min(own, settings.ARENA_MAX_REPLY_SECONDS)


def export_tasks(tasks: Iterable[Task]) -> dict[str, Any]:
    """Tasks as the JSON that services.import_tasks reads back."""
    return {
        "tasks": [
            {
                "slug": task.slug,
                "title": task.title,
                "category": task.category,
                "system_prompt": task.system_prompt,
                # Only where set, as the bundled file writes it.
                **({"context": task.context} if task.context else {}),
                "active": task.active,
                "notes": task.notes,
                "turns": [
                    {
                        "prompt": turn.prompt,
                        # Only where set, as the bundled file writes it.
                        **({"corrects_previous": True} if turn.corrects_previous else {}),
                        "expected_output": turn.expected_output,
                        "checker": turn.checker,
                        "checker_options": turn.checker_options,
                    }
                    for turn in task.turns.order_by("position")
                ],
            }
            for task in tasks
        ]
    }


@dataclass(frozen=True)
class EvaluationReport:
    run: EvaluationRun
    reliability: list[dict[str, Any]]  # Per model: its ratings per attempt.
    dialog: list[dict[str, Any]]  # Per model: its final rating per turn, with the tries it took.
    fixing: list[dict[str, Any]]  # Per model: per attempt, whose mistake and the rating.
    recap: list[dict[str, Any]]  # Models ranked by tally.
    turns: list[str]  # The scripted prompts, for the dialog table's header.
    discernment: list[dict[str, Any]]  # Per model: valid vs false corrections (evaluation.discernment).
    feedback: list[dict[str, Any]]  # Per model: fix rate per kind of feedback.
    hidden: list[str]  # Models whose texts are withheld here (evaluation.published), by name.


def models_in_arena(names: Iterable[str] | None = None) -> frozenset[str]:
    """The models (of ``names``, or all) on the roster: enabled, whatever their sampling weight
    (a weight of 0 is a pause, and a text once published cannot be taken back when the model
    returns). Their texts are not published (votes.evaluation.published)."""
    llms = LLM.objects.filter(enabled=True)
    if names is not None:
        llms = llms.filter(name__in=list(names))
    return frozenset(llms.values_list("name", flat=True))


def evaluation_report(run: EvaluationRun, *, reveal_texts: bool = False) -> EvaluationReport:
    """The three tables and the recap of the seed write-up, from a run's stored replies. The
    replies of models in the arena, and what quotes them, are withheld unless ``reveal_texts``
    (staff): see ``evaluation.published``."""
    records = [reply.as_record() for reply in run.replies.select_related("model", "mistake_by").order_by("pk")]
    models = sorted({record.model for record in records} | {llm.name for llm in run.llms.all()})
    hidden = frozenset() if reveal_texts else models_in_arena(models)
    symbol = evaluation.SYMBOLS
    final = evaluation.turn_ratings(records)
    tries: dict[tuple[str, int], int] = {}
    for record in records:
        if record.part == evaluation.DIALOG:
            tries[(record.model, record.turn)] = record.try_number
    shown = [evaluation.published(record, hidden) for record in records]
    turns = list(run.task.turns.order_by("position").values_list("prompt", flat=True))
    return EvaluationReport(
        run=run,
        reliability=[
            {
                "model": model,
                "ratings": [
                    {**r, "symbol": symbol[r["rating"]]}
                    for r in shown
                    if r["model"] == model and r["part"] == evaluation.RELIABILITY
                ],
            }
            for model in models
        ],
        dialog=[
            {
                "model": model,
                "turns": [
                    {
                        "symbol": symbol[final[(model, index)]] if (model, index) in final else "",
                        "corrections": tries.get((model, index), 0),
                        "replies": [
                            r
                            for r in shown
                            if r["model"] == model and r["part"] == evaluation.DIALOG and r["turn"] == index
                        ],
                    }
                    for index in range(len(turns))
                ],
            }
            for model in models
        ],
        fixing=[
            {
                "model": model,
                "attempts": [
                    {**r, "symbol": symbol[r["rating"]], "turn": r["turn"] + 1}
                    for r in shown
                    if r["model"] == model and r["part"] == evaluation.FIXING
                ],
            }
            for model in models
        ],
        recap=[
            {"rank": rank, "model": model, **tally}
            for rank, (model, tally) in enumerate(evaluation.recap(records), start=1)
        ],
        turns=turns,
        discernment=evaluation.discernment(records) if run.decoys else [],
        feedback=evaluation.feedback_rates(records) if run.feedback_mistakes else [],
        hidden=sorted(hidden),
    )


def evaluation_fixability(run: EvaluationRun) -> list[fixing.FixAbility]:
    """The run's fix-ability board: every fix episode of the run (``evaluation.fix_episodes``:
    dialog corrections, other models' mistakes, the three kinds of feedback) rated with the
    site's fix-ability model. Episodes of one mistake (a model's dialog turn, or the mistake of
    another model it was handed) are one cluster, as a live battle's are."""
    records = [reply.as_record() for reply in run.replies.select_related("model", "mistake_by").order_by("pk")]
    episodes = [
        fixing.Episode(
            model=episode.model,
            task=run.task.slug,
            turn=episode.turn,
            fixed=episode.fixed,
            battle=f"run {run.pk}: {episode.model} on {episode.mistake_by or episode.model}'s turn {episode.turn}",
            specificity=feedback.specificity(episode.correction),
            attempt=episode.attempt,
        )
        for episode in evaluation.fix_episodes(records)
    ]
    return fixing.rate_fixes(episodes) if episodes else []


def evaluation_summary(run: EvaluationRun) -> dict[str, Any]:
    """A finished run as one JSON object (``evaluate --json``): per model, the scripted dialog's
    turns that ended ✓ or 🥦, reliability, fix-ability with its 95% interval, fixes per kind
    of feedback, and the discernment table."""
    report = evaluation_report(run, reveal_texts=True)
    records = [reply.as_record() for reply in run.replies.select_related("model", "mistake_by").order_by("pk")]
    final = evaluation.turn_ratings(records)
    fixability = {row.model: row for row in evaluation_fixability(run)}
    feedback_rows = {row["model"]: row["kinds"] for row in report.feedback}
    discernment_rows = {row["model"]: row for row in report.discernment}
    models = []
    for model in sorted({llm.name for llm in run.llms.all()}):
        reliable = [r for r in records if r.model == model and r.part == evaluation.RELIABILITY]
        rated = fixability.get(model)
        models.append(
            {
                "model": model,
                "dialog_turns_ok": sum(
                    final.get((model, index)) in (evaluation.CORRECT, evaluation.FIXED)
                    for index in range(len(report.turns))
                ),
                "dialog": [evaluation.SYMBOLS.get(final.get((model, i), ""), "") for i in range(len(report.turns))],
                "reliability": {
                    "correct": sum(r.rating == evaluation.CORRECT for r in reliable),
                    "attempts": len(reliable),
                },
                "fixability": {
                    "rating": rated.rating if rated else None,
                    "lower": rated.lower if rated else None,
                    "upper": rated.upper if rated else None,
                    "fixed": rated.fixed if rated else 0,
                    "episodes": rated.episodes if rated else 0,
                },
                "feedback": {
                    kind: {"fixed": share["successes"], "episodes": share["trials"]}
                    for kind, share in feedback_rows.get(model, {}).items()
                },
                "discernment": discernment_rows.get(model, {}),
            }
        )
    return {"run": run.pk, "task": run.task.slug, "models": models}


def research_battle(battle: Battle) -> dict[str, Any]:
    """An ended battle for researchers: conversations, ratings, checks, votes; the voter only
    as the judge pseudonym (never the session)."""
    from votes.research import judge_id

    state = battle_state(battle)
    return {
        "battle_id": battle.public_id,
        "model_a": battle.model_a.name,
        "model_b": battle.model_b.name,
        "judge": judge_id(battle.voter_key),
        "task": battle.task.slug if battle.task else None,
        "system_prompt": battle.system_prompt if battle.task_id else None,
        "context": battle.context if battle.task_id else None,
        "script": research_script(battle),
        "created": battle.created.isoformat(),
        "ended": battle.ended.isoformat() if battle.ended else None,
        "mode": battle.mode,
        "excluded": battle.excluded,
        "excluded_reason": battle.excluded_reason or None,
        "votes": [
            {"stage": vote.stage, "choice": vote.choice, "after_turn": vote.after_turn}
            for vote in battle.votes.order_by("pk")
        ],
        "turns": state["turns"],
    }


def research_script(battle: Battle) -> list[dict[str, Any]] | None:
    """The scripted turns a task battle's models were given (Battle.script), for researchers:
    each prompt, its expected output and whether it corrects the previous reply. None: free chat."""
    if battle.task_id is None:
        return None
    return [
        {key: turn.get(key) for key in ("prompt", "expected_output", "corrects_previous")} for turn in battle.script
    ]


def recent_evaluation_runs(limit: int) -> list[EvaluationRun]:
    return list(EvaluationRun.objects.select_related("task").prefetch_related("llms").order_by("-pk")[:limit])


def evaluation_run(run_id: int) -> EvaluationRun | None:
    return EvaluationRun.objects.select_related("task").filter(pk=run_id).first()


def evaluation_progress(run: EvaluationRun) -> dict[str, Any]:
    """Where a run stands, as its page shows it live: status, steps done of the total, and an
    estimate of the seconds left (None until a step is done, and once it has ended)."""
    seconds_left = run.seconds_left(timezone.now())
    return {
        "id": run.pk,
        "status": run.status,
        "status_label": run.get_status_display(),
        "progress": run.progress,
        "total": run.total,
        "seconds_left": None if seconds_left is None else round(seconds_left),
        "unfinished": run.unfinished,
        "error": run.error,
    }


def research_evaluation(run: EvaluationRun, *, reveal_texts: bool = False) -> dict[str, Any]:
    """A run for the API: its recap and tables, and every reply as ``evaluation.published``
    shows it (texts of models in the arena withheld unless ``reveal_texts``)."""
    report = evaluation_report(run, reveal_texts=reveal_texts)
    hidden = frozenset(report.hidden)
    return {
        "id": run.pk,
        "task": run.task.slug,
        "status": run.status,
        "attempts": run.attempts,
        "max_tries": run.max_tries,
        "fix_attempts": run.fix_attempts,
        "decoys": run.decoys,
        "feedback_mistakes": run.feedback_mistakes,
        "recap": report.recap,
        "discernment": report.discernment,
        "feedback": report.feedback,
        "texts_hidden_for": report.hidden,
        "replies": [
            evaluation.published(reply.as_record(), hidden)
            for reply in run.replies.select_related("model", "mistake_by").order_by("pk")
        ],
    }


EPISODE_CHUNK = 2000  # Battles read at a time: their scripts and messages, never every battle's at once.


def fix_episodes(battles: QuerySet[Battle] | None = None) -> list[FixEpisode]:
    """The fix episodes of ended battles (or of ``battles``), unsaved: what votes.corrections
    finds in each side's messages, judged against the battle's own script (Battle.script). A
    direct chat has one side and none that waits: its prompts are no voter's corrections."""
    battles = Battle.objects.filter(state=Battle.State.ENDED) if battles is None else battles
    ids = list(battles.order_by("pk").values_list("pk", flat=True))
    found: list[FixEpisode] = []
    for start in range(0, len(ids), EPISODE_CHUNK):
        chunk = ids[start : start + EPISODE_CHUNK]
        chunk_battles = {
            battle.pk: battle
            for battle in Battle.objects.filter(pk__in=chunk).only(
                "pk", "task_id", "model_a_id", "model_b_id", "mode", "script"
            )
        }
        rows = (
            Message.objects.filter(battle_id__in=chunk)
            .order_by("battle_id")
            .values_list(
                "battle_id", "side", "turn", "role", "content", "script_turn", "rating", "check_verdict", "check_parts"
            )
        )
        for battle_id, battle_rows in itertools.groupby(
            rows.iterator(chunk_size=EPISODE_CHUNK), key=lambda row: row[0]
        ):
            battle = chunk_battles[battle_id]
            messages = [corrections.Message(*row[1:]) for row in battle_rows]
            by_side = corrections.battle_episodes(
                messages,
                battle.scripted_corrections,
                _scripted_parts(battle),
                one_side_corrects=battle.mode != Battle.Mode.DIRECT,
            )
            for side, episodes in by_side.items():
                found += [
                    FixEpisode(
                        battle_id=battle_id,
                        side=side,
                        task_id=battle.task_id,
                        model_id=battle.model_a_id if side == "a" else battle.model_b_id,
                        **episode.row(),
                    )
                    for episode in episodes
                ]
    return found


def _scripted_parts(battle: Battle) -> Callable[[int, str], dict[str, bool]]:
    """A reply judged part by part by one of the battle's scripted turns ({}: no checker)."""
    return lambda position, reply: _checked_parts_of(battle.scripted_turn(position), reply)


def correction_prompt(reply: Message) -> corrections.Prompt:
    """The prompt a reply answers, as votes.corrections reads it (empty if it has none)."""
    prompts = Message.objects.filter(battle_id=reply.battle_id, turn=reply.turn, role=Message.Role.USER)
    sides = {message.side: message for message in prompts}
    own = sides.get(reply.side)
    if own is None:
        return corrections.Prompt("", None, False)
    alone = set(sides) == {reply.side} and reply.battle.mode != Battle.Mode.DIRECT
    return corrections.Prompt(own.content, own.script_turn, alone)


def episode_history(episode: FixEpisode) -> list[Message]:
    """The messages of a live episode's side up to its wrong reply, in order (user first)."""
    if episode.battle_id is None:
        return []
    return list(
        Message.objects.filter(battle_id=episode.battle_id, side=episode.side, turn__lte=episode.wrong_turn).order_by(
            "turn", "-role"
        )
    )


def free_task_slug(base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ...: the first that no task has."""
    slug, number = base, 1
    while Task.objects.filter(slug=slug).exists():
        number += 1
        slug = f"{base}-{number}"
    return slug


def promotion_defaults(episode: FixEpisode) -> dict[str, Any]:
    """What the promote form starts from: a free slug, and the checker (and expected output)
    of the scripted turn the correction's reply answered, when the battle was on a task."""
    slug = free_task_slug(f"{episode.task.slug if episode.task else 'chat'}-fix-{episode.pk}"[:56])
    defaults: dict[str, Any] = {"slug": slug, "title": f"Fix: {episode.correction}"[:200], "active": True}
    if episode.task is not None and episode.script_turn is not None:
        turns = {turn.position: turn for turn in episode.task.turns.all()}
        scripted_next = turns.get(episode.script_turn + 1)
        answered = (
            scripted_next
            if episode.source == FixEpisode.Source.SCRIPTED and scripted_next is not None
            else turns.get(episode.script_turn)
        )
        if answered is not None:
            defaults |= {
                "expected_output": answered.expected_output,
                "checker": answered.checker,
                "checker_options": answered.checker_options,
            }
    return defaults


def evaluation_fix_episodes() -> list[FixEpisode]:
    """The fix episodes of every finished evaluation run (``evaluation.fix_episodes``), unsaved."""
    found: list[FixEpisode] = []
    runs = EvaluationRun.objects.filter(status=EvaluationRun.Status.DONE).select_related("task")
    for run in runs:
        replies = run.replies.select_related("model", "mistake_by").order_by("pk")
        llms = {reply.model.name: reply.model for reply in replies}
        llms |= {reply.mistake_by.name: reply.mistake_by for reply in replies if reply.mistake_by}
        turns = list(run.task.turns.order_by("position"))
        records = [reply.as_record() for reply in replies]
        for episode in evaluation.fix_episodes(records, functools.partial(_checked_parts, turns)):
            found.append(
                FixEpisode(
                    evaluation_run=run,
                    model=llms[episode.model],
                    mistake_by=llms[episode.mistake_by] if episode.mistake_by else None,
                    task=run.task,
                    wrong_turn=episode.turn,
                    script_turn=episode.turn,
                    attempt=episode.attempt,
                    correction=episode.correction,
                    source=episode.source,
                    specificity=feedback.specificity(episode.correction),
                    fixed=episode.fixed,
                    turns_to_fix=episode.turns_to_fix,
                    regression=episode.regression,
                )
            )
    return found


def _checked_parts(turns: list[TaskTurn], record: evaluation.Record) -> dict[str, bool]:
    """An evaluation reply judged part by part by its scripted turn's checker ({}: no checker)."""
    return _checked_parts_of(turns[record.turn].as_script(), record.reply) if record.turn < len(turns) else {}


def _checked_parts_of(turn: dict[str, Any] | None, reply: str) -> dict[str, bool]:
    """A reply judged part by part by a scripted turn (``TaskTurn.as_script``; {}: no checker)."""
    try:
        result = check_scripted(turn, reply) if turn is not None else None
    except CheckerConfigError:
        return {}
    return dict(result.parts) if result is not None else {}


def seen_style(message_model: type[Message] = Message) -> dict[str, Coalesce]:
    """For an update (or query) on votes: each side's replies up to the vote's ``after_turn``,
    summed per style feature (leaderboard.style.FEATURES: the length in tokens, or characters / 4
    for a reply without a token count, and the markdown counts taken when each reply finished),
    as the ``seen_<feature>_<side>`` columns. ``message_model``: a migration's historical one."""
    per_feature = {
        "length": Coalesce(Cast("token_count", FloatField()), Cast(Length("content"), FloatField()) / 4.0),
        "headers": Cast("header_count", FloatField()),
        "lists": Cast("list_count", FloatField()),
        "bold": Cast("bold_count", FloatField()),
    }
    sums = {}
    for side in "ab":
        seen = message_model.objects.filter(
            battle=OuterRef("battle"), role="assistant", side=side, turn__lte=OuterRef("after_turn")
        ).order_by()
        for feature in style.FEATURES:
            total = seen.values("battle").annotate(total=Sum(per_feature[feature])).values("total")[:1]
            sums[f"seen_{feature}_{side}"] = Coalesce(Subquery(total, output_field=FloatField()), 0.0)
    return sums
