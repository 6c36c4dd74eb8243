"""The model roster: which LLMs take part in battles and where their generation jobs go."""

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Least

from inference import context_budget


def parse_mesh_shape(value: str) -> tuple[int, int] | None:
    """ "1,8" -> (1, 8); blank -> None (all local devices on the model axis)."""
    if not value.strip():
        return None
    parts = [part.strip() for part in value.split(",")]
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f'A mesh shape is two positive integers "batch,model", e.g. "1,8"; got {value!r}.')
    return int(parts[0]), int(parts[1])


def validate_mesh_shape(value: str) -> None:
    try:
        parse_mesh_shape(value)
    except ValueError as error:
        raise ValidationError(str(error)) from error


# An endpoint's key is read from a variable named like one: never SECRET_KEY, DATABASE_URL or
# another of the arena's own secrets, which the request would otherwise send to the endpoint.
_KEY_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*_API_KEY")


def validate_env_name(value: str) -> None:
    if value and not _KEY_ENV_NAME.fullmatch(value):
        raise ValidationError(
            f"{value!r} is not the name of an API key variable: give the name (letters, digits, underscores, ending "
            'in "_API_KEY", e.g. "VLLM_API_KEY") of the environment variable that holds the key, never the key.'
        )


class Family(models.TextChoices):
    GEMMA = "gemma", "Gemma"
    LLAMA3 = "llama3", "Llama 3"
    MISTRAL = "mistral", "Mistral"
    VICUNA = "vicuna", "Vicuna"
    CHATML = "chatml", "ChatML (SmolLM2, Qwen)"
    COMPLETION = "completion", "Completion (pretrained base model)"


# What a model samples with unless an admin sets otherwise (the register commands' entries too):
# a fresh seed per reply, so that Regenerate gives a new reply and one prompt does not always get
# one text. Evaluation runs decode greedily whatever these say.
DEFAULT_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "top_k": 0}
# The defaults of an entry saved before they sampled: greedy, never set by an admin.
OLD_GREEDY_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}

GREEDY_NOTE = (
    "A greedy model (temperature 0, top-k 1 or top-p 0) gives the same reply to the same prompt every "
    "time: its replies are a lookup table that names it, so it is never drawn into anonymous battles. "
    "Named and direct battles may still use it."
)


CONTEXT_NOTE = (
    "Anonymous battles draw only models whose context holds the arena's longest conversation "
    "(ARENA_MAX_CONVERSATION_BYTES, as inference.context_budget counts it) and a whole reply: a refusal "
    "for length then comes from the arena, the same with every pair. Empty (unknown): not drawn."
)


def samples(*, temperature: float, top_k: int, top_p: float) -> bool:
    """Whether these settings draw tokens at random (inference.engine.sampling): a temperature
    above 0, and neither top-k 1 nor top-p 0, which keep only the most likely token."""
    return temperature > 0 and top_k != 1 and top_p > 0


class LLMQuerySet(models.QuerySet["LLM"]):
    def enabled(self) -> "LLMQuerySet":
        return self.filter(enabled=True, sampling_weight__gt=0)

    def sampling(self) -> "LLMQuerySet":
        """The models whose settings sample (``samples``)."""
        return self.filter(temperature__gt=0, top_p__gt=0).exclude(top_k=1)

    def fitting(self) -> "LLMQuerySet":
        """The models whose context holds any conversation the arena accepts and a whole reply
        (``fits_arena``)."""
        reply = Least(F("max_new_tokens"), Value(settings.ARENA_MAX_NEW_TOKENS))
        return self.filter(context_tokens__gte=Value(settings.ARENA_MAX_CONVERSATION_BYTES) + reply)

    def anonymous(self) -> "LLMQuerySet":
        """The models anonymous battles draw: enabled, sampling, and fitting the arena's limit."""
        return self.enabled().sampling().fitting()


class LLM(models.Model):
    """One contestant. Its name is secret to voters until they have voted."""

    name = models.CharField(max_length=100, unique=True, help_text="Public name, revealed after the vote.")
    family = models.CharField(
        max_length=20,
        choices=Family.choices,
        blank=True,
        help_text="Its chat template. Blank only for a model served elsewhere whose server applies the template.",
    )
    preset = models.CharField(
        max_length=500,
        blank=True,
        help_text="A local preset folder, or a Kaggle/Hugging Face handle loaded with from_preset (the arena's own "
        "keras-hub hosts); blank for a model served elsewhere (the endpoint below).",
    )
    # Served elsewhere: any OpenAI-compatible server (vLLM, a hosted API, another arena host).
    # Database defaults as well: rows written by code from before these fields (a rolling
    # deploy, a migration's historical model) are models the arena hosts.
    endpoint_url = models.URLField(
        max_length=500,
        blank=True,
        default="",
        db_default="",
        validators=[URLValidator(schemes=["http", "https"])],
        help_text='The OpenAI-compatible API root that serves this model, e.g. "http://vllm:8000/v1"; blank: the '
        "arena's own keras-hub host loads the preset.",
    )
    served_model = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text='The name the endpoint serves the model under (its "model" field).',
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        validators=[validate_env_name],
        help_text="The environment variable of the generation workers that holds the endpoint's API key (the key "
        "itself is never stored here); blank: no key.",
    )
    server_applies_template = models.BooleanField(
        default=True,
        db_default=True,
        help_text="The endpoint applies the model's chat template (/chat/completions with messages). Off: the arena "
        "renders the prompt with the family's template and sends a plain completion (/completions).",
    )
    queue = models.CharField(
        max_length=100,
        blank=True,
        help_text='Celery queue of the workers that generate this model\'s replies; default "model.<name>" (hosted '
        "here) or ARENA_ENDPOINT_QUEUE (served elsewhere).",
    )
    base = models.BooleanField(
        default=False,
        help_text='A pretrained base model, not tuned to chat: labelled "base" in the roster and on the leaderboard.',
    )
    enabled = models.BooleanField(default=True)
    sampling_weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="Relative chance of being drawn into a battle; 0 takes it out of new battles.",
    )
    dtype = models.CharField(
        max_length=20, blank=True, help_text='Weights dtype, e.g. "bfloat16"; blank keeps the preset\'s own.'
    )
    mesh_shape = models.CharField(
        max_length=20,
        blank=True,
        validators=[validate_mesh_shape],
        help_text='Device mesh "batch,model", e.g. "1,8"; blank puts every local device on the model axis.',
    )
    # Sampling settings of this model's battle replies (temperature 0 is greedy decoding).
    temperature = models.FloatField(
        default=DEFAULT_SAMPLING["temperature"],
        validators=[MinValueValidator(0.0), MaxValueValidator(5.0)],
        help_text="0 decodes greedily. " + GREEDY_NOTE,
    )
    top_k = models.PositiveIntegerField(
        default=DEFAULT_SAMPLING["top_k"], help_text="0 disables top-k filtering; 1 is greedy decoding."
    )
    top_p = models.FloatField(
        default=DEFAULT_SAMPLING["top_p"],
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="1 disables top-p filtering; 0 is greedy decoding.",
    )
    max_new_tokens = models.PositiveIntegerField(
        default=96,
        validators=[MinValueValidator(1)],
        help_text="Tokens a reply may take (at most ARENA_MAX_NEW_TOKENS); a reply cut here says so.",
    )
    max_reply_seconds = models.FloatField(
        default=60.0,
        db_default=60.0,
        validators=[MinValueValidator(1.0)],
        help_text="Seconds a reply may write, from its first text shown (at most ARENA_MAX_REPLY_SECONDS); a reply "
        "cut here keeps the text shown and says so.",
    )
    sustained_chars_per_s = models.FloatField(
        null=True,
        blank=True,
        editable=False,
        help_text="What the model sustains: the 10th percentile of its own speeds on its recent replies, measured by "
        "its workers before pacing. Anonymous battles are paced at the slowest enabled model's, named and direct "
        "ones at the slower of their own.",
    )
    context_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens of prompt plus reply the model takes (its preset's sequence length; filled in when it is "
        "registered). " + CONTEXT_NOTE,
    )
    typical_first_token_ms = models.FloatField(
        null=True,
        blank=True,
        editable=False,
        help_text="How long the model typically takes to its first token: the 90th percentile of its times on its "
        "recent replies. No anonymous reply shows text sooner than the slowest enabled model's.",
    )
    created = models.DateTimeField(auto_now_add=True)

    objects = LLMQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "LLM"
        verbose_name_plural = "LLMs"
        constraints = [
            models.CheckConstraint(condition=models.Q(sampling_weight__gte=0), name="llm_sampling_weight_non_negative"),
            models.CheckConstraint(
                condition=models.Q(top_p__gte=0, top_p__lte=1, temperature__gte=0), name="llm_sampling_in_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: object, **kwargs: object) -> None:
        if not self.queue:
            self.queue = settings.ARENA_ENDPOINT_QUEUE if self.endpoint_url else f"model.{self.name}"
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def clean(self) -> None:
        super().clean()
        errors: dict[str, str] = {}
        if self.endpoint_url:
            if not self.served_model:
                errors["served_model"] = "A model served elsewhere needs the name its endpoint serves it under."
            if not self.context_tokens:
                errors["context_tokens"] = (
                    "A model served elsewhere needs its context length (the arena cannot read it)."
                )
            if not self.server_applies_template and not self.family:
                errors["family"] = "The arena renders this model's prompt: choose its template family."
        else:
            if not self.preset:
                errors["preset"] = "A model the arena hosts needs its preset (or give the endpoint that serves it)."
            if not self.family:
                errors["family"] = "A model the arena hosts needs its template family."
        if errors:
            raise ValidationError(errors)

    @property
    def served_elsewhere(self) -> bool:
        """Served by an OpenAI-compatible endpoint rather than the arena's own keras-hub host."""
        return bool(self.endpoint_url)

    @property
    def samples(self) -> bool:
        return samples(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def fits_arena(self) -> bool:
        """Whether the model's context holds the arena's longest conversation and a whole reply."""
        reply = min(self.max_new_tokens, settings.ARENA_MAX_NEW_TOKENS)
        needed = context_budget.context_needed(settings.ARENA_MAX_CONVERSATION_BYTES, reply)
        return self.context_tokens is not None and self.context_tokens >= needed
