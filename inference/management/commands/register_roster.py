from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import registry
from inference.models import DEFAULT_SAMPLING, LLM, OLD_GREEDY_DEFAULTS

# Every registered model samples (a fresh seed per reply): a greedy one is never drawn into
# anonymous battles (inference.models.GREEDY_NOTE). Evaluation runs stay greedy.
REAL_MODEL_SAMPLING = DEFAULT_SAMPLING


def upgrade_greedy_defaults(model: LLM) -> bool:
    """An entry saved with the old greedy defaults (never an admin's choice of sampling) gets the
    sampling settings; any other settings are kept. Whether it was changed."""
    if {field: getattr(model, field) for field in OLD_GREEDY_DEFAULTS} != OLD_GREEDY_DEFAULTS:
        return False
    for field, value in DEFAULT_SAMPLING.items():
        setattr(model, field, value)
    model.save(update_fields=list(DEFAULT_SAMPLING))
    return True


class Command(BaseCommand):
    help = (
        "Register the default roster: every imported real checkpoint (ARENA_IMPORTED_PRESETS_DIR) and the bundled "
        "weak demo model, all sampling at temperature 0.7 / top-p 0.95, each with its preset's context (anonymous "
        "battles draw only models whose context holds ARENA_MAX_CONVERSATION_BYTES and a reply). Admin edits of "
        "existing entries are kept; an entry still at the old greedy defaults is given those sampling settings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--imported", type=Path, default=settings.ARENA_IMPORTED_PRESETS_DIR)
        parser.add_argument("--bundled", type=Path, default=settings.ARENA_PRESETS_DIR)

    def handle(self, *args: object, **options: object) -> None:
        try:
            imported = registry.local_presets(Path(str(options["imported"])))
            bundled = [p for p in registry.local_presets(Path(str(options["bundled"]))) if p.quality == "weak"]
        except ValueError as error:
            raise CommandError(str(error)) from error
        if not imported:
            raise CommandError(f"No imported presets in {options['imported']}; run scripts/serve (it imports them).")
        for preset in [*imported, *bundled]:
            path = preset.path.resolve()
            stored = str(path.relative_to(settings.BASE_DIR)) if path.is_relative_to(settings.BASE_DIR) else str(path)
            # What the preset says about itself; the admin's settings (sampling, weight…) are kept.
            described = {
                "family": preset.family,
                "preset": stored,
                "base": preset.base,
                "context_tokens": preset.context,
            }
            model, created = LLM.objects.get_or_create(name=preset.name, defaults={**described, **REAL_MODEL_SAMPLING})
            upgrade_greedy_defaults(model)
            if not created and any(getattr(model, field) != value for field, value in described.items()):
                for field, value in described.items():
                    setattr(model, field, value)
                model.save(update_fields=list(described))
            label = "base model" if preset.base else "chat model"
            self.stdout.write(f"{'Added' if created else 'Kept'} {model.name} ({model.family}, {label}) -> {stored}")
