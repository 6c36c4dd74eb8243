from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference import registry
from inference.management.commands.register_roster import upgrade_greedy_defaults
from inference.models import LLM


class Command(BaseCommand):
    help = (
        "Add (or update) an LLM roster entry for every bundled preset folder, sampling at temperature 0.7 / "
        "top-p 0.95 (an entry still at the old greedy defaults is given those)."
    )

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--dir", type=Path, default=settings.ARENA_PRESETS_DIR, help="Folder of presets.")

    def handle(self, *args: object, **options: object) -> None:
        directory = Path(str(options["dir"])).resolve()
        try:
            presets = registry.local_presets(directory)
        except ValueError as error:
            raise CommandError(str(error)) from error
        if not presets:
            raise CommandError(f"No presets in {directory}; run `python manage.py build_demo_models` first.")
        for preset in presets:
            path = preset.path.resolve()
            stored = str(path.relative_to(settings.BASE_DIR)) if path.is_relative_to(settings.BASE_DIR) else str(path)
            model, created = LLM.objects.update_or_create(
                name=preset.name, defaults={"family": preset.family, "preset": stored, "context_tokens": preset.context}
            )
            upgrade_greedy_defaults(model)
            self.stdout.write(f"{'Added' if created else 'Updated'} {model.name} ({model.family}) -> {stored}")
