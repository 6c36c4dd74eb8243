"""Benchmark the continuous-batching engine against serial keras-hub generate() (inference.bench)."""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


def _levels(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"--concurrency takes comma-separated integers, got {value!r}.") from None
    if not levels or any(level < 1 for level in levels):
        raise CommandError(f"--concurrency levels must be positive integers, got {value!r}.")
    return levels


class Command(BaseCommand):
    help = (
        "Compare serial keras-hub generate() with the continuous-batching engine on calendar prompts: "
        "TTFT p50/p95, per-stream and aggregate tokens/s, compilations after warm-up."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--preset", type=Path, default=None, help="Preset folder (default: the strongest bundled).")
        parser.add_argument("--prompts", type=int, default=32, help="Number of prompts per measurement.")
        parser.add_argument("--max-new-tokens", type=int, default=64, help="New tokens for the longest prompt.")
        parser.add_argument("--concurrency", default="1,4,8,16", help="Comma-separated client counts.")
        parser.add_argument("--slots", type=int, default=8, help="Engine decode slots.")
        parser.add_argument(
            "--steps-per-dispatch",
            type=int,
            default=None,
            help="Engine tokens per slot per dispatch (default: adaptive, as the arena serves).",
        )
        parser.add_argument(
            "--repeats", type=int, default=3, help="Rounds of every path, taken in turn and pooled (default 3)."
        )
        parser.add_argument(
            "--no-prefix-cache", action="store_true", help="Run the engine without its prefix cache (for comparison)."
        )
        parser.add_argument(
            "--timing-seconds",
            type=float,
            default=1.0,
            help="How long each timing of the machine runs (a third of each busy decode step's); default 1.",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: keras and jax take seconds to import, and other commands must not pay it.
        from inference.bench import default_preset, format_table, run_bench

        preset = options["preset"] or default_preset()
        if not (Path(preset) / "config.json").is_file():
            raise CommandError(f"{preset} is not a keras-hub preset folder (no config.json).")
        try:
            result = run_bench(
                preset,
                prompts=options["prompts"],
                max_new_tokens=options["max_new_tokens"],
                concurrency=_levels(options["concurrency"]),
                slots=options["slots"],
                steps_per_dispatch=options["steps_per_dispatch"],
                repeats=options["repeats"],
                prefix_cache=not options["no_prefix_cache"],
                progress=None if options["json"] else lambda message: self.stderr.write(message),
                timing_seconds=options["timing_seconds"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result) if options["json"] else format_table(result))
