from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import registry
from inference.models import LLM

# Real pretrained models sample (a fresh seed per reply), so that Regenerate gives a new reply
# and one prompt does not always get one text; evaluation runs and equality tests stay greedy.
REAL_MODEL_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "top_k": 0}


class Command(BaseCommand):
    help = (
        "Register the default roster: every imported real checkpoint (ARENA_IMPORTED_PRESETS_DIR, sampling at "
        "temperature 0.7 / top-p 0.95) and the bundled weak demo model. Admin edits of existing entries are kept."
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
        for preset, sampling in [*((p, REAL_MODEL_SAMPLING) for p in imported), *((p, {}) for p in bundled)]:
            path = preset.path.resolve()
            stored = str(path.relative_to(settings.BASE_DIR)) if path.is_relative_to(settings.BASE_DIR) else str(path)
            model, created = LLM.objects.get_or_create(
                name=preset.name, defaults={"family": preset.family, "preset": stored, "base": preset.base, **sampling}
            )
            if not created and (model.family, model.preset, model.base) != (preset.family, stored, preset.base):
                model.family, model.preset, model.base = preset.family, stored, preset.base
                model.save(update_fields=["family", "preset", "base"])
            label = "base model" if preset.base else "chat model"
            self.stdout.write(f"{'Added' if created else 'Kept'} {model.name} ({model.family}, {label}) -> {stored}")
