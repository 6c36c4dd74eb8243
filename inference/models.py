"""The model roster: which LLMs take part in battles and where their generation jobs go."""

from django.core.validators import MinValueValidator
from django.db import models


class Family(models.TextChoices):
    GEMMA = "gemma", "Gemma"
    LLAMA3 = "llama3", "Llama 3"
    MISTRAL = "mistral", "Mistral"
    VICUNA = "vicuna", "Vicuna"


class LLMQuerySet(models.QuerySet["LLM"]):
    def enabled(self) -> "LLMQuerySet":
        return self.filter(enabled=True, sampling_weight__gt=0)


class LLM(models.Model):
    """One contestant. Its name is secret to voters until they have voted."""

    name = models.CharField(max_length=100, unique=True, help_text="Public name, revealed after the vote.")
    family = models.CharField(max_length=20, choices=Family.choices)
    preset = models.CharField(
        max_length=500,
        help_text="A local preset folder, or a Kaggle/Hugging Face handle loaded with from_preset.",
    )
    queue = models.CharField(
        max_length=100,
        blank=True,
        help_text='Celery queue of the inference hosts that hold this model; default "model.<name>".',
    )
    enabled = models.BooleanField(default=True)
    sampling_weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="Relative chance of being drawn into a battle; 0 takes it out of new battles.",
    )
    max_new_tokens = models.PositiveIntegerField(default=96)
    created = models.DateTimeField(auto_now_add=True)

    objects = LLMQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "LLM"
        verbose_name_plural = "LLMs"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(sampling_weight__gte=0), name="llm_sampling_weight_non_negative"
            )
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: object, **kwargs: object) -> None:
        if not self.queue:
            self.queue = f"model.{self.name}"
        super().save(*args, **kwargs)  # type: ignore[arg-type]
