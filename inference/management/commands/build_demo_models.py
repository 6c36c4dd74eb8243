"""Build the bundled tiny demo models (see inference.demo_models) as keras-hub preset folders."""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "presets"


class Command(BaseCommand):
    help = "Train the demo tokenizers, build tiny Gemma and Llama 3 models and save them as presets."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder to write presets into.")
        parser.add_argument("--seed", type=int, default=0, help="Seed for corpus, tokenizers and weights.")

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: keras and jax take seconds to import, and other commands must not pay it.
        from inference.demo_models import build_demo_models, iter_preset_files

        for path in build_demo_models(Path(options["out"]), seed=options["seed"]):
            size = sum(f.stat().st_size for f in iter_preset_files(path))
            self.stdout.write(f"Wrote {path} ({size / 1e6:.1f} MB)")
