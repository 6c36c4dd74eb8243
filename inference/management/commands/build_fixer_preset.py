from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.building import fixer


class Command(BaseCommand):
    help = (
        "Build the fine-tuned contestants' presets: each one's imported base with its committed LoRA weights merged "
        "in (every contestant in inference/fixer, or --model)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", choices=sorted(fixer.FIXERS), help="One contestant (default: all).")
        parser.add_argument("--base", type=Path, help="Its imported base preset (with --model).")
        parser.add_argument("--weights", type=Path, help="Its LoRA weights (with --model).")
        parser.add_argument("--out", type=Path, help="Where its preset goes (with --model).")
        parser.add_argument(
            "--if-stale",
            action="store_true",
            help="Do nothing for a preset already built from this base and these weights (sha256s in its metadata).",
        )

    def handle(self, *args: object, **options: object) -> None:
        presets = Path(settings.ARENA_IMPORTED_PRESETS_DIR)
        if options["model"] is None and any(options[key] for key in ("base", "weights", "out")):
            raise CommandError("--base, --weights and --out name one contestant's files: give --model too.")
        specs = [fixer.FIXERS[str(options["model"])]] if options["model"] else list(fixer.FIXERS.values())
        for spec in specs:
            base = Path(str(options["base"] or presets / spec.base))
            weights = Path(str(options["weights"] or spec.weights))
            out = Path(str(options["out"] or presets / spec.name))
            if not (base / "config.json").is_file():
                raise CommandError(f"{base} is not a preset; import it first (scripts/serve imports the real models).")
            if not weights.is_file() and not options["model"]:
                self.stdout.write(f"{spec.name}: no weights in {weights.parent} (train them with finetune_fixer)")
                continue
            if not weights.is_file():
                raise CommandError(f"{weights} is missing; train it with manage.py finetune_fixer --model {spec.name}.")
            if options["if_stale"] and fixer.is_built_from(out, base, weights):
                self.stdout.write(f"{out} is up to date with {weights.name}")
                continue
            fixer.build_fixer_preset(spec, base, weights, out, {"weights_bytes": weights.stat().st_size})
            self.stdout.write(f"Built {out} from {base.name} + {weights.name}")
