"""Battles, the messages exchanged in them, and votes.

Every user turn and every reply lives here: the channel layer only carries transient deltas, so a
client that reconnects rebuilds the whole battle from these rows.
"""

import secrets

from django.db import models
from django.db.models import Q

from inference.models import LLM


def new_public_id() -> str:
    # 128 bits of randomness: a battle id cannot be guessed or enumerated.
    return secrets.token_urlsafe(16)


class Side(models.TextChoices):
    A = "a", "A"
    B = "b", "B"


class Battle(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        VOTED = "voted", "Voted"

    public_id = models.CharField(max_length=32, unique=True, default=new_public_id, editable=False)
    model_a = models.ForeignKey(LLM, on_delete=models.PROTECT, related_name="battles_as_a")
    model_b = models.ForeignKey(LLM, on_delete=models.PROTECT, related_name="battles_as_b")
    voter_key = models.CharField(
        max_length=64, db_index=True, help_text="Keyed hash of the voter's session, never the session."
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]
        constraints = [models.CheckConstraint(condition=~Q(model_a=models.F("model_b")), name="battle_distinct_models")]

    def __str__(self) -> str:
        return f"Battle {self.public_id}"

    @property
    def is_voted(self) -> bool:
        return self.state == self.State.VOTED

    def model_on(self, side: str) -> LLM:
        return self.model_a if side == Side.A else self.model_b

    def reveal(self) -> dict[str, str] | None:
        """The model names by side, or None while the vote is still open (anonymity)."""
        if not self.is_voted:
            return None
        return {Side.A: self.model_a.name, Side.B: self.model_b.name}


class Message(models.Model):
    """One turn's message on one side: the user's prompt or the model's reply to it."""

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        STREAMING = "streaming", "Streaming"
        DONE = "done", "Done"
        STOPPED = "stopped", "Stopped by the voter"
        FAILED = "failed", "Failed"

    FINISHED_STATUSES = (Status.DONE, Status.STOPPED, Status.FAILED)

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
    stop_reason = models.CharField(max_length=10, blank=True, help_text="stop, length, cancelled or error.")
    seed = models.PositiveIntegerField(null=True, blank=True, help_text="Sampling seed, for reproducibility.")
    token_count = models.PositiveIntegerField(null=True, blank=True)
    time_to_first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["battle", "turn", "side", "role"]
        constraints = [models.UniqueConstraint(fields=["battle", "side", "turn", "role"], name="message_unique_slot")]
        indexes = [models.Index(fields=["battle", "turn"])]

    def __str__(self) -> str:
        return f"{self.battle.public_id} turn {self.turn} {self.side} {self.role}"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED_STATUSES


class Vote(models.Model):
    class Choice(models.TextChoices):
        A = "a", "A is better"
        B = "b", "B is better"
        TIE = "tie", "Tie"
        BOTH_BAD = "both_bad", "Both are bad"

    # One vote per battle, enforced by the database.
    battle = models.OneToOneField(Battle, on_delete=models.CASCADE, related_name="vote")
    choice = models.CharField(max_length=10, choices=Choice.choices)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.battle.public_id}: {self.choice}"
