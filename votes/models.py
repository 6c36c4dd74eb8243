"""Battles, the messages exchanged in them, and votes.

Every user turn and every reply lives here: the channel layer only carries transient deltas, so a
client that reconnects rebuilds the whole battle from these rows.
"""

import datetime
import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from inference import context_budget
from inference.models import LLM
from leaderboard import style
from votes import checkers, evaluation, feedback


def new_public_id() -> str:
    # 128 bits of randomness: a battle id cannot be guessed or enumerated.
    return secrets.token_urlsafe(16)


class Side(models.TextChoices):
    A = "a", "A"
    B = "b", "B"


class Rating(models.TextChoices):
    """A reply's rating, by the voter or by an evaluation run (the seed experiment's symbols)."""

    CORRECT = "correct", "✓ correct"
    MISTAKE = "mistake", "🍄 mistake"
    FIXED = "fixed", "🥦 fixed"
    GARBAGE = "garbage", "🔥 garbage"


class Verdict(models.TextChoices):
    """An automatic checker's verdict (votes.checkers)."""

    CORRECT = "correct", "correct"
    MISTAKE = "mistake", "mistake"
    GARBAGE = "garbage", "garbage"


class TaskQuerySet(models.QuerySet["Task"]):
    def active(self) -> "TaskQuerySet":
        return self.filter(active=True)


class Task(models.Model):
    """A curated task: a system prompt and a scripted dialog with expected outputs."""

    slug = models.SlugField(max_length=60, unique=True, help_text="Short name used in URLs and commands.")
    title = models.CharField(max_length=200)
    category = models.CharField(max_length=100, blank=True)
    system_prompt = models.TextField(blank=True)
    context = models.JSONField(
        default=list,
        blank=True,
        help_text="A conversation both models are handed as their own before the first scripted prompt, "
        'as [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]: a real '
        "mistake promoted from a battle, which the first scripted prompt corrects.",
    )
    active = models.BooleanField(default=True, help_text="Offered to voters and to evaluation runs.")
    notes = models.TextField(blank=True, help_text="For admins; never shown to voters.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        ordering = ["title"]

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        context = self.context
        roles = ["user", "assistant"] * (len(context) // 2 + 1) if isinstance(context, list) else []
        if not isinstance(context, list) or not all(
            isinstance(item, dict)
            and set(item) == {"role", "content"}
            and item["role"] == role
            and isinstance(item["content"], str)
            and item["content"].strip()
            for item, role in zip(context, roles, strict=False)
        ):
            raise ValidationError(
                {"context": 'Give a list of {"role": ..., "content": ...}: user and assistant in turn, from user.'}
            )
        if context and context[-1]["role"] != "assistant":
            raise ValidationError({"context": "The context ends with the model's reply the first prompt answers."})
        size = context_budget.conversation_size(self.system_prompt, [item["content"] for item in context] + [""])
        if size > settings.ARENA_MAX_CONVERSATION_BYTES:
            raise ValidationError(
                f"The system prompt and context come to {size:,} of the {settings.ARENA_MAX_CONVERSATION_BYTES:,} "
                "bytes a conversation may hold (ARENA_MAX_CONVERSATION_BYTES): no prompt would fit."
            )

    def context_conversation(self) -> list[tuple[str, str]]:
        """The context as (role, content) pairs, as generation takes a conversation."""
        return [(item["role"], item["content"]) for item in self.context]

    def snapshot(self) -> dict[str, Any]:
        """What a battle on this task keeps of it (Battle.system_prompt, context, script): what
        its models are given and how their replies are judged, whatever the task becomes."""
        return {
            "system_prompt": self.system_prompt,
            "context": self.context,
            "script": [turn.as_script() for turn in self.turns.order_by("position")],
        }


class TaskTurn(models.Model):
    """One scripted step: the user's prompt, the expected reply and how to check a reply."""

    class Checker(models.TextChoices):
        PYTHON_CALL = "python_call", "Python call"
        EXACT = "exact", "Exact text"
        REGEX = "regex", "Regular expression"
        JSON = "json", "JSON"
        NONE = "none", "No automatic check"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="turns")
    position = models.PositiveIntegerField(help_text="0-based order in the dialog.")
    prompt = models.TextField()
    expected_output = models.TextField(blank=True)
    checker = models.CharField(max_length=20, choices=Checker.choices, default=Checker.PYTHON_CALL)
    checker_options = models.JSONField(
        default=dict,
        blank=True,
        help_text='e.g. {"signature": ["action.remove_calendar_entry(title, date, time)"], '
        '"case_insensitive": ["title"], "patterns": {"date": "\\\\d{4}-11-11"}}',
    )
    corrects_previous = models.BooleanField(
        default=False,
        help_text='This scripted prompt corrects the previous reply (the calendar\'s "The current year is 2024."): '
        "after a wrong reply, it starts a fix episode.",
    )

    class Meta:
        ordering = ["task", "position"]
        constraints = [models.UniqueConstraint(fields=["task", "position"], name="task_turn_unique_position")]

    def __str__(self) -> str:
        return f"{self.task.slug} #{self.position + 1}"

    def clean(self) -> None:
        if self.checker == self.Checker.NONE:
            return
        if not self.expected_output.strip():
            raise ValidationError({"expected_output": "An automatic check needs an expected output."})
        try:
            checkers.validate(self.checker, self.expected_output, self.checker_options or {})
        except checkers.CheckerConfigError as error:
            raise ValidationError({"checker_options": str(error)}) from None

    def check_reply(self, reply: str) -> checkers.CheckResult | None:
        """The automatic verdict on a reply to this turn, or None when the turn has no check."""
        return check_scripted(self.as_script(), reply)

    def as_script(self) -> dict[str, Any]:
        """The turn as a battle's script keeps it (Battle.script)."""
        return {field: getattr(self, field) for field in SCRIPT_FIELDS}


SCRIPT_FIELDS = ("prompt", "expected_output", "checker", "checker_options", "corrects_previous")


def check_scripted(turn: dict[str, Any], reply: str) -> checkers.CheckResult | None:
    """The automatic verdict on a reply to a scripted turn (``TaskTurn.as_script``), or None when
    the turn has no check."""
    if turn["checker"] == TaskTurn.Checker.NONE:
        return None
    return checkers.check(turn["checker"], turn["expected_output"], reply, turn["checker_options"] or {})


class Battle(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        ENDED = "ended", "Ended, models revealed"

    class EndedBy(models.TextChoices):
        VOTER = "voter", "Its voter"
        IDLE = "idle", "The idle timeout"

    class Mode(models.TextChoices):
        ANONYMOUS = "anonymous", "Anonymous battle (the leaderboard's)"
        NAMED = "named", "Named side by side (the voter picks both models)"
        DIRECT = "direct", "Direct chat with one model"

    public_id = models.CharField(max_length=32, unique=True, default=new_public_id, editable=False)
    model_a = models.ForeignKey(LLM, on_delete=models.PROTECT, related_name="battles_as_a")
    model_b = models.ForeignKey(LLM, on_delete=models.PROTECT, related_name="battles_as_b")
    task = models.ForeignKey(
        Task, on_delete=models.PROTECT, null=True, blank=True, related_name="battles", help_text="Empty: free chat."
    )
    voter_key = models.CharField(
        max_length=64, db_index=True, help_text="Keyed hash of the voter's session, never the session."
    )
    network_key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        db_index=True,
        help_text="Keyed hash of the client's network (/24 IPv4, /64 IPv6), never the address: the identity a "
        "fresh session does not reset. Empty: no address, or started before it was recorded.",
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    mode = models.CharField(
        max_length=10,
        choices=Mode.choices,
        default=Mode.ANONYMOUS,
        db_default=Mode.ANONYMOUS,
        help_text="Only anonymous battles count on the leaderboard: in the others the voter knows the names "
        "(they are stored excluded, with the mode as the reason). A direct chat has one model, on side A "
        "(model_b is the same model, unused).",
    )
    share_id = models.CharField(
        max_length=32,
        unique=True,
        null=True,
        blank=True,
        editable=False,
        help_text="The read-only share page's id (/share/<id>/), set when the battle ends.",
    )
    excluded = models.BooleanField(
        default=False, help_text="Its votes are kept but stay out of the leaderboard (see excluded_reason)."
    )
    excluded_reason = models.CharField(max_length=300, blank=True)
    closed_reason = models.CharField(
        max_length=300,
        blank=True,
        default="",
        db_default="",
        help_text="Set when a reply names a model after the voter's first vote: the votes cast before it "
        "count, and the battle takes no more prompts, votes or ratings (the voter can only end it).",
    )
    created = models.DateTimeField(auto_now_add=True)
    ended = models.DateTimeField(null=True, blank=True)
    ended_by = models.CharField(
        max_length=10,
        choices=EndedBy.choices,
        blank=True,
        help_text="Who ended the battle: its voter, or the idle timeout (ARENA_BATTLE_IDLE_SECONDS) once they "
        "had voted and gone quiet, so that their votes count.",
    )
    # The database's default too: battles written by COPY (the leaderboard benchmark) get it.
    last_action = models.DateTimeField(
        default=timezone.now,
        db_default=Now(),
        help_text="The voter's latest prompt, rating, vote, regeneration or stop: the idle clock.",
    )
    seen_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a page of the battle was last open (refreshed while one is). Its replies stop once every "
        "page has been gone for ARENA_LEAVE_GRACE_SECONDS. Empty: no page ever watched it.",
    )
    pace_chars_per_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Characters a second at which every reply of this battle is shown (votes.pacing): an "
        "anonymous battle's is what the slowest enabled model sustained when it started, whatever its pair; a named "
        "or direct one's what its slower model sustains. Empty: ARENA_STREAM_CHARS_PER_S.",
    )
    first_text_lead_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Anonymous battles: no reply's pace starts sooner than this many seconds after its worker started "
        "on it, what the slowest enabled model typically took to its first token when the battle started "
        "(votes.pacing). Empty: no such wait.",
    )
    pair_probability = models.FloatField(
        null=True,
        blank=True,
        help_text="The probability this pair had of being drawn (votes.pairing): the leaderboard weighs its "
        "votes by the inverse. Empty: drawn before it was recorded.",
    )
    # What the battle's models were given: the task as it was when the battle started (the
    # database's defaults too: battles written by COPY, the leaderboard benchmark's, get them).
    system_prompt = models.TextField(
        blank=True, default="", db_default="", help_text="The task's system prompt as this battle's models got it."
    )
    context = models.JSONField(
        default=list,
        db_default=models.Value([], output_field=models.JSONField()),
        blank=True,
        help_text="The task's context conversation as this battle's models got it.",
    )
    script = models.JSONField(
        default=list,
        db_default=models.Value([], output_field=models.JSONField()),
        blank=True,
        help_text="The task's scripted turns when the battle started (prompt, expected output, checker, its "
        "options, whether it corrects the previous reply): what its prompts are matched and its replies "
        "checked against, whatever the task becomes.",
    )
    # The database's default too: battles written by COPY (the leaderboard benchmark) get it.
    tallied = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        help_text="Its votes are in the leaderboard's running counts (leaderboard.tally): set by a refresh once "
        "the battle has ended.",
    )

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(model_a=models.F("model_b")) | Q(mode="direct"), name="battle_distinct_models"
            )
        ]
        # A refresh looks for the ended battles not counted yet, and for the unfinished ones.
        indexes = [models.Index(fields=["state"], condition=Q(tallied=False), name="battle_not_tallied")]

    def __str__(self) -> str:
        return f"Battle {self.public_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """``tallied`` is the refresh's to write (one UPDATE): a full save of an instance loaded
        before a refresh counted the battle must not write the old value back, or the next
        refresh would count it twice. It is written only where a save names it."""
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [
                field.name for field in self._meta.concrete_fields if not field.primary_key and field.name != "tallied"
            ]
        super().save(*args, **kwargs)

    @property
    def is_ended(self) -> bool:
        return self.state == self.State.ENDED

    def model_on(self, side: str) -> LLM:
        return self.model_a if side == Side.A else self.model_b

    @property
    def is_anonymous(self) -> bool:
        return self.mode == self.Mode.ANONYMOUS

    def reveal(self) -> dict[str, str] | None:
        """The model names by side: in an anonymous battle None until it has ended (anonymity);
        the voter chose them in the other modes. A direct chat has side A only."""
        if self.is_anonymous and not self.is_ended:
            return None
        if self.mode == self.Mode.DIRECT:
            return {Side.A: self.model_a.name}
        return {Side.A: self.model_a.name, Side.B: self.model_b.name}

    def scripted_turn(self, position: int | None) -> dict[str, Any] | None:
        """The battle's scripted turn at ``position`` (Task.snapshot), None if it has none there."""
        if position is None or not 0 <= position < len(self.script):
            return None
        return self.script[position]

    @property
    def scripted_corrections(self) -> frozenset[int]:
        """The positions of the scripted turns marked as corrections."""
        return frozenset(position for position, turn in enumerate(self.script) if turn.get("corrects_previous"))

    def exclude(self, reason: str) -> None:
        """Keep the battle's votes out of the leaderboard; the first reason found is kept."""
        if not self.excluded:
            self.excluded = True
            self.excluded_reason = reason[:300]
            self.save(update_fields=["excluded", "excluded_reason"])

    def close_after_vote(self, reason: str) -> None:
        """A model named itself after the voter voted: keep the votes cast before (they were
        blind) and take no more prompts, votes or ratings; the first reason found is kept."""
        if not self.closed_reason:
            self.closed_reason = reason[:300]
            self.save(update_fields=["closed_reason"])


class Message(models.Model):
    """One turn's message on one side: the user's prompt or the model's reply to it."""

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        STREAMING = "streaming", "Streaming"
        DONE = "done", "Done"
        STOPPED = "stopped", "Stopped (by the voter, or the server stopping)"
        FAILED = "failed", "Failed"

    FINISHED_STATUSES = (Status.DONE, Status.STOPPED, Status.FAILED)
    # Stop reasons of a reply that hit its cap (tokens, seconds): it was cut, not ended by its model.
    CUT_REASONS = ("length", "time")

    battle = models.ForeignKey(Battle, on_delete=models.CASCADE, related_name="messages")
    side = models.CharField(max_length=1, choices=Side.choices)
    turn = models.PositiveIntegerField(help_text="0-based turn: one user prompt and the reply to it.")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True, help_text="For a reply being streamed: the text so far.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DONE)
    delta_count = models.PositiveIntegerField(
        default=0, help_text="Delta frames already covered by content: where a reconnecting client resumes."
    )
    stop_requested = models.BooleanField(
        default=False, help_text="The voter stopped this reply or left; the worker stops at its next flush."
    )
    stop_reason = models.CharField(
        max_length=10,
        blank=True,
        help_text="stop (the model ended it), length (its token cap), time (its seconds cap), cancelled, shutdown "
        "(the server stopped) or error.",
    )
    error = models.CharField(max_length=200, blank=True, help_text="What the voter was told when the reply failed.")
    heartbeat = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the reply last showed progress: queued, claimed by a worker, or that worker's heartbeat. "
        "An unfinished reply silent for too long is failed (votes.services.fail_stalled_replies).",
    )
    seed = models.PositiveIntegerField(null=True, blank=True, help_text="Sampling seed, for reproducibility.")
    script_turn = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Task battles: the scripted turn this prompt is, or whose expected output this reply is checked "
        "against (a correction keeps the turn it corrects).",
    )
    rating = models.CharField(max_length=10, choices=Rating.choices, blank=True, help_text="The voter's rating.")
    check_verdict = models.CharField(max_length=10, choices=Verdict.choices, blank=True)
    check_reason = models.TextField(blank=True, help_text="The checker's reason, shown after the battle ends.")
    check_parts = models.JSONField(
        default=dict,
        blank=True,
        help_text="The checker's judgement part by part (each argument of a call: right or wrong).",
    )
    identity_leak = models.CharField(
        max_length=100, blank=True, help_text="The model, family or maker this reply names, if any."
    )
    regenerations = models.PositiveIntegerField(default=0, help_text="Times the voter regenerated this reply.")
    token_count = models.PositiveIntegerField(null=True, blank=True)
    # Markdown of a finished reply (leaderboard.style.markdown_counts), for style control: counted
    # once, so that a leaderboard refresh never reads the replies' text.
    header_count = models.PositiveIntegerField(null=True, blank=True)
    list_count = models.PositiveIntegerField(null=True, blank=True)
    bold_count = models.PositiveIntegerField(null=True, blank=True)
    time_to_first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    generation_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The model's own time for this reply, before pacing: from its request to its last token.",
    )
    first_token_at = models.DateTimeField(
        null=True, blank=True, help_text="When the model's first text of this reply reached its worker."
    )
    claimed_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When a worker started on this reply (its latest attempt)."
    )
    model_chars_per_s = models.FloatField(
        null=True,
        blank=True,
        help_text=(
            "The model's own speed on this reply, before pacing: characters a second from its first text to its last."
        ),
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["battle", "turn", "side", "role"]
        constraints = [models.UniqueConstraint(fields=["battle", "side", "turn", "role"], name="message_unique_slot")]
        indexes = [models.Index(fields=["battle", "turn"])]

    def __str__(self) -> str:
        return f"{self.battle.public_id} turn {self.turn} {self.side} {self.role}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A reply's markdown is counted whenever its text is saved (votes.services.finish_reply,
        # which updates without save(), counts it itself).
        fields = kwargs.get("update_fields")
        if self.role == self.Role.ASSISTANT and self.content and (fields is None or "content" in fields):
            self.header_count, self.list_count, self.bold_count = style.markdown_counts(self.content)
            if fields is not None:
                kwargs["update_fields"] = {*fields, "header_count", "list_count", "bold_count"}
        super().save(*args, **kwargs)

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED_STATUSES

    @property
    def cut(self) -> bool:
        """Whether a cap (the reply's tokens or seconds) ended it rather than its model."""
        return self.status == self.Status.DONE and self.stop_reason in self.CUT_REASONS


class ResearcherKey(models.Model):
    """An API key for the research API: issued and revoked in the admin; only its hash is kept."""

    name = models.CharField(max_length=200, help_text="Who it is for.")
    prefix = models.CharField(max_length=12, editable=False, help_text="The key's first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    revoked = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class FlagSource(models.TextChoices):
    """Who set a flag (FlaggedVoter, FlaggedNetwork)."""

    ADMIN = "admin", "An admin"
    AUTOMATIC = "automatic", "Anomaly detection"


class FlaggedNetwork(models.Model):
    """A client network (Battle.network_key) whose votes, taken together, are anomalous: a
    campaign that starts each battle in a fresh session has too few votes per voter key to judge,
    but not per network. The campaign's votes stay out through flags on the voters behind it
    whose votes there mostly chose its target (leaderboard.anomaly.campaign_voters; FlaggedVoter
    rows pointing here), refreshed at every leaderboard refresh, so that every read of the board,
    the research data and the exports leaves them out as a flagged voter's; the other voters
    behind it keep their votes. Clearing it in the admin clears those flags too, and the
    detection leaves the network alone from then on."""

    network_key = models.CharField(max_length=64, unique=True, help_text="The battles' network_key (a keyed hash).")
    reason = models.CharField(max_length=300)
    source = models.CharField(max_length=10, choices=FlagSource.choices, default=FlagSource.ADMIN)
    p_value = models.FloatField(null=True, blank=True, help_text="Anomaly detection: the network's p-value.")
    cleared = models.BooleanField(default=False, help_text="Reviewed and cleared: the votes count again.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"network {self.network_key[:12]}…: {self.reason}"


class FlaggedVoter(models.Model):
    """A voter whose votes stay out of the leaderboard (kept, and counted as excluded).

    Flagged by an admin, or by the anomaly detection of each leaderboard refresh
    (leaderboard.anomaly). An admin who clears a flag puts the votes back, and the detection
    leaves that voter alone from then on.
    """

    Source = FlagSource

    voter_key = models.CharField(max_length=64, unique=True, help_text="The battles' voter_key (a keyed hash).")
    network = models.ForeignKey(
        FlaggedNetwork,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="voter_flags",
        help_text="Set: the voter is flagged because it voted from this flagged network.",
    )
    reason = models.CharField(max_length=300)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.ADMIN)
    p_value = models.FloatField(null=True, blank=True, help_text="Anomaly detection: Fisher's combined p-value.")
    cleared = models.BooleanField(default=False, help_text="Reviewed and cleared: the votes count again.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.voter_key[:12]}…: {self.reason}"


class Vote(models.Model):
    class Choice(models.TextChoices):
        A = "a", "A is better"
        B = "b", "B is better"
        TIE = "tie", "Tie"
        BOTH_BAD = "both_bad", "Both are bad"

    class Stage(models.TextChoices):
        FIRST_TRY = "first_try", "First try"
        AFTER_FIX = "after_fix", "After fix"

    battle = models.ForeignKey(Battle, on_delete=models.CASCADE, related_name="votes")
    # One vote per stage and battle, enforced by the database.
    stage = models.CharField(max_length=10, choices=Stage.choices, default=Stage.FIRST_TRY)
    after_turn = models.PositiveIntegerField(default=0, help_text="The last turn the voter had seen.")
    choice = models.CharField(max_length=10, choices=Choice.choices)
    created = models.DateTimeField(auto_now_add=True)
    over_daily_cap = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Cast after its voter or its network had cast the day's counted votes "
        "(ARENA_VOTES_PER_VOTER_PER_DAY, "
        "ARENA_VOTES_PER_NETWORK_PER_DAY): kept, but left out of the leaderboard.",
    )
    # The style of what the voter had seen when voting (each side's replies up to ``after_turn``:
    # length in tokens, markdown headers, list items, bold spans: leaderboard.style.FEATURES), stored with the vote
    # so that style control reads one row per vote instead of summing every reply at each refresh.
    seen_length_a = models.FloatField(default=0.0)
    seen_headers_a = models.FloatField(default=0.0)
    seen_lists_a = models.FloatField(default=0.0)
    seen_bold_a = models.FloatField(default=0.0)
    seen_length_b = models.FloatField(default=0.0)
    seen_headers_b = models.FloatField(default=0.0)
    seen_lists_b = models.FloatField(default=0.0)
    seen_bold_b = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-created"]
        constraints = [models.UniqueConstraint(fields=["battle", "stage"], name="vote_one_per_stage")]

    def __str__(self) -> str:
        return f"{self.battle.public_id} {self.stage}: {self.choice}"


class EvaluationRun(models.Model):
    """The seed experiment, automated: reliability, the complete dialog, fixing others' mistakes."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        INTERRUPTED = "interrupted", "Interrupted (the server stopped)"
        CANCELLED = "cancelled", "Cancelled"

    # What "Run again" in the admin starts over.
    RESTARTABLE_STATUSES = (Status.FAILED, Status.INTERRUPTED, Status.CANCELLED)
    # What "Cancel" stops.
    UNFINISHED_STATUSES = (Status.PENDING, Status.RUNNING)

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="evaluation_runs")
    llms = models.ManyToManyField(LLM, related_name="evaluation_runs", verbose_name="models")
    attempts = models.PositiveSmallIntegerField(default=5, help_text="Reliability: repeats of the first prompt.")
    max_tries = models.PositiveSmallIntegerField(default=3, help_text="Dialog: corrections sent per turn at most.")
    fix_attempts = models.PositiveSmallIntegerField(default=3, help_text="Fixing others' mistakes: attempts.")
    decoys = models.PositiveSmallIntegerField(
        default=3, help_text="Discernment: false corrections after correct dialog replies, at most."
    )
    feedback_mistakes = models.PositiveSmallIntegerField(
        default=2, help_text="Feedback specificity: own mistakes corrected three ways, at most."
    )
    status = models.CharField(max_length=11, choices=Status.choices, default=Status.PENDING)
    progress = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True, help_text="When a worker began it (this time).")
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"Evaluation {self.pk} of {self.task.slug}"

    @property
    def unfinished(self) -> bool:
        return self.status in self.UNFINISHED_STATUSES

    def seconds_left(self, now: datetime.datetime) -> float | None:
        """An estimate of the time a running run still needs: its steps so far took this long
        each on average, and so will the rest. None before its first step is done."""
        if self.status != self.Status.RUNNING or self.started is None or self.progress == 0:
            return None
        per_step = (now - self.started).total_seconds() / self.progress
        return max(0.0, per_step * (self.total - self.progress))


class EvaluationReply(models.Model):
    """One rated reply of an evaluation run."""

    class Part(models.TextChoices):
        RELIABILITY = "reliability", "Reliability"
        DIALOG = "dialog", "Complete dialog"
        FIXING = "fixing", "Fixing other models' mistakes"
        DISCERNMENT = "discernment", "False corrections (discernment)"
        FEEDBACK = "feedback", "Feedback specificity"

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="replies")
    model = models.ForeignKey(LLM, on_delete=models.CASCADE, related_name="+")
    part = models.CharField(max_length=12, choices=Part.choices)
    attempt = models.PositiveSmallIntegerField(default=0)
    turn = models.PositiveSmallIntegerField(default=0, help_text="The scripted turn (0-based).")
    try_number = models.PositiveSmallIntegerField(default=0, help_text="0: the scripted prompt; then corrections.")
    prompt = models.TextField(help_text="What was sent: the scripted prompt or the correction.")
    reply = models.TextField()
    verdict = models.CharField(max_length=10, choices=Verdict.choices)
    reason = models.TextField(blank=True)
    rating = models.CharField(max_length=10, choices=Rating.choices)
    mistake_by = models.ForeignKey(
        LLM, on_delete=models.CASCADE, null=True, blank=True, related_name="+", help_text="Fixing: whose mistake."
    )
    feedback_kind = models.CharField(
        max_length=10, blank=True, help_text="Feedback specificity: generic, human or checker."
    )

    class Meta:
        ordering = ["run", "model", "part", "attempt", "turn", "try_number"]

    def __str__(self) -> str:
        return f"{self.run} {self.model} {self.part} {self.attempt}/{self.turn}/{self.try_number}"

    # The fields of votes.evaluation.Record, besides the models (stored as roster rows here).
    RECORD_FIELDS = (
        "part",
        "attempt",
        "turn",
        "try_number",
        "prompt",
        "reply",
        "verdict",
        "reason",
        "rating",
        "feedback_kind",
    )

    @classmethod
    def from_record(cls, run: "EvaluationRun", record: evaluation.Record, llms: dict[str, LLM]) -> "EvaluationReply":
        return cls(
            run=run,
            model=llms[record.model],
            mistake_by=llms[record.mistake_by] if record.mistake_by else None,
            **{name: getattr(record, name) for name in cls.RECORD_FIELDS},
        )

    def as_record(self) -> evaluation.Record:
        return evaluation.Record(
            model=self.model.name,
            mistake_by=self.mistake_by.name if self.mistake_by else None,
            **{name: getattr(self, name) for name in self.RECORD_FIELDS},
        )


class FixEpisode(models.Model):
    """A reply judged wrong, the correction sent to that side, and the reply to it: the unit the
    "Fixing mistakes" board rates (leaderboard.fixing). Rebuilt from the battles' messages at
    every leaderboard refresh (votes.services.record_fix_episodes)."""

    class Source(models.TextChoices):
        SCRIPTED = "scripted", "The task's script"
        VOTER = "voter", "The voter"
        CHECKER = "checker", "The checker's reason"

    class Specificity(models.TextChoices):
        GENERIC = feedback.GENERIC, "Generic"
        POINTING = feedback.POINTING, "Points at the error"
        PRESCRIPTIVE = feedback.PRESCRIPTIVE, "Gives the right value"

    battle = models.ForeignKey(
        Battle, on_delete=models.CASCADE, null=True, blank=True, related_name="fix_episodes", help_text="Live battles."
    )
    evaluation_run = models.ForeignKey(
        "EvaluationRun",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="fix_episodes",
        help_text="Evaluation runs (their episodes are exported, not on the live board).",
    )
    model = models.ForeignKey(LLM, on_delete=models.CASCADE, related_name="fix_episodes")
    mistake_by = models.ForeignKey(
        LLM,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        help_text="Evaluation runs: whose mistake it was, when another model's.",
    )
    task = models.ForeignKey(Task, on_delete=models.CASCADE, null=True, blank=True, related_name="fix_episodes")
    side = models.CharField(max_length=1, choices=Side.choices, blank=True)
    wrong_turn = models.PositiveIntegerField(
        help_text="The battle turn of the reply judged wrong (evaluation runs: its scripted turn)."
    )
    script_turn = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The scripted turn that reply answered: the difficulty the rating controls for.",
    )
    attempt = models.PositiveSmallIntegerField(
        default=1, help_text="1 for the first correction of this mistake, 2 when the first did not fix it, ..."
    )
    correction = models.TextField()
    source = models.CharField(max_length=10, choices=Source.choices)
    specificity = models.CharField(max_length=12, choices=Specificity.choices)
    fixed = models.BooleanField(help_text="The checker judged the reply correct, or the voter rated it 🥦 or ✓.")
    regression = models.BooleanField(
        null=True,
        blank=True,
        help_text="The reply broke a part the wrong one had right (checker, field by field); empty: not checked.",
    )
    persisted = models.BooleanField(
        null=True,
        blank=True,
        help_text="The facts it fixed (values the checker expected: the year 2024) stayed right in that side's "
        "later replies that expect the same; empty: none to judge.",
    )
    turns_to_fix = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The corrections this mistake took to be fixed; empty: never fixed."
    )
    # The leaderboard's two fix-rate columns, each from one judge alone.
    voter_fixed = models.BooleanField(
        null=True,
        blank=True,
        help_text="The voter rated the wrong reply 🍄/🔥 and the answer 🥦 or ✓ (yes) or not (no); empty: not rated.",
    )
    checker_fixed = models.BooleanField(
        null=True,
        blank=True,
        help_text="The checker judged the wrong reply wrong, the answer correct (yes) or not (no); empty: unjudged.",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["battle", "side", "wrong_turn"]
        constraints = [
            models.UniqueConstraint(fields=["battle", "side", "wrong_turn"], name="fix_episode_one_per_wrong_reply")
        ]

    def __str__(self) -> str:
        where = self.battle.public_id if self.battle else f"evaluation {self.evaluation_run_id}"
        return f"{where} {self.side}{self.wrong_turn}: {'fixed' if self.fixed else 'not fixed'}"
