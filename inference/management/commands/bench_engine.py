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
        parser.add_argument(
            "--slots", type=int, help="Engine decode slots (default 8; with --memory, ARENA_ENGINE_SLOTS)."
        )
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
        parser.add_argument(
            "--against",
            metavar="URL",
            help="Instead: the arena's own host (this preset, served over HTTP by a child process) against the "
            "OpenAI-compatible server at URL (its API root, e.g. http://127.0.0.1:8000/v1) serving the same model, "
            "on the same prompts (inference.bench_against).",
        )
        parser.add_argument("--served-model", help="With --against: the name that server serves the model under.")
        parser.add_argument("--api-key-env", help="With --against: the variable holding that server's API key.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")
        parser.add_argument(
            "--memory",
            action="store_true",
            help="Instead: the resident memory the preset holds in the arena's engine, loaded and warm, with "
            "ARENA_ENGINE_SLOTS and the prefix pool settings (--slots overrides the slots), then a decode step of "
            "every slot at each window up to 1024 positions, timed. Run one preset per process.",
        )
        parser.add_argument(
            "--beside",
            type=Path,
            help="With --memory: load and warm this preset first, as the arena serves them together, and report what "
            "--preset adds beside it (a fixer beside its base shares its equal weights and compiled programs).",
        )
        parser.add_argument(
            "--adapter",
            type=Path,
            action="append",
            default=[],
            help="With --memory: a preset fine-tuned from --preset, served by its engine as a LoRA adapter, as the "
            "roster serves a fixer beside its base (ARENA_FIXERS_AS_ADAPTERS); repeatable. Reports the engine with "
            "them all.",
        )
        parser.add_argument(
            "--sampling",
            action="store_true",
            help="Instead: what one sampling step of --slots rows (default 4) costs at the arena's default sampling "
            "settings, on the preset's own next-token logits: among the most likely tokens first (as the engine "
            "draws) against sorting the whole vocabulary, and greedy.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: keras and jax take seconds to import, and other commands must not pay it.
        from inference.bench import default_preset, format_table, run_bench

        preset = options["preset"] or default_preset()
        if not (Path(preset) / "config.json").is_file():
            raise CommandError(f"{preset} is not a keras-hub preset folder (no config.json).")
        if (options["beside"] or options["adapter"]) and not options["memory"]:
            raise CommandError("--beside and --adapter go with --memory.")
        for other in [options["beside"], *options["adapter"]]:
            if other and not (Path(other) / "config.json").is_file():
                raise CommandError(f"{other} is not a keras-hub preset folder (no config.json).")
        if options["against"]:
            self.against(Path(preset), options)
            return
        if options["memory"]:
            self.memory(Path(preset), options)
            return
        if options["sampling"]:
            self.sampling(Path(preset), options)
            return
        try:
            result = run_bench(
                preset,
                prompts=options["prompts"],
                max_new_tokens=options["max_new_tokens"],
                concurrency=_levels(options["concurrency"]),
                slots=options["slots"] or 8,
                steps_per_dispatch=options["steps_per_dispatch"],
                repeats=options["repeats"],
                prefix_cache=not options["no_prefix_cache"],
                progress=None if options["json"] else lambda message: self.stderr.write(message),
                timing_seconds=options["timing_seconds"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result) if options["json"] else format_table(result))

    def sampling(self, preset: Path, options: dict[str, Any]) -> None:
        from inference.bench import bench_prompts
        from inference.bench_sampling import format_sampling, sampling_step
        from inference.keras_build import causal_lm_from_preset
        from inference.models import DEFAULT_SAMPLING
        from inference.registry import read_preset

        prompts = bench_prompts(read_preset(preset).family, options["slots"] or 4)
        result = sampling_step(
            causal_lm_from_preset(str(preset)), prompts, seconds=options["timing_seconds"], **DEFAULT_SAMPLING
        )
        self.stdout.write(json.dumps(result) if options["json"] else format_sampling(preset, result))

    def memory(self, preset: Path, options: dict[str, Any]) -> None:
        from django.conf import settings

        from inference import model_process

        model_process.prepare()  # As the embedded arena's process is (manage.py serve).
        from inference.bench import format_memory, resident_memory

        result = resident_memory(
            preset,
            slots=options["slots"] or settings.ARENA_ENGINE_SLOTS,
            prefix_cache_rows=settings.ARENA_PREFIX_CACHE_ROWS,
            prefix_cache_tokens=settings.ARENA_PREFIX_CACHE_TOKENS,
            compact=settings.ARENA_ENGINE_COMPACT,
            cache_dtype=settings.ARENA_ENGINE_CACHE_DTYPE or None,
            embedding_dtype=settings.ARENA_ENGINE_EMBEDDING_DTYPE or None,
            beside=options["beside"],
            adapters=options["adapter"],
        )
        self.stdout.write(json.dumps(result) if options["json"] else format_memory(result))

    def against(self, preset: Path, options: dict[str, Any]) -> None:
        import os
        import tempfile

        from inference import bench_against
        from inference.bench import bench_prompts
        from inference.hosts.openai_server import host_process
        from inference.registry import read_preset

        if not options["served_model"]:
            raise CommandError("--against needs --served-model: the name the other server serves the model under.")
        key = os.environ.get(options["api_key_env"]) if options["api_key_env"] else None
        other = bench_against.Server(options["against"], options["served_model"], key)
        prompts = bench_prompts(read_preset(preset).family, options["prompts"])
        log = Path(tempfile.mkdtemp(prefix="arena-bench-host-")) / "host.log"
        progress = None if options["json"] else self.stderr.write
        try:
            with host_process({"arena": preset}, log, slots=options["slots"] or 8) as url:
                result = bench_against.run_against(
                    bench_against.Server(url, "arena"),
                    other,
                    prompts,
                    max_new_tokens=options["max_new_tokens"],
                    concurrency=_levels(options["concurrency"]),
                    repeats=options["repeats"],
                    progress=progress,
                )
        except (RuntimeError, ValueError, OSError) as error:
            raise CommandError(f"The benchmark failed: {error}") from error
        result["preset"] = str(preset)
        result["cpus"] = os.cpu_count()
        self.stdout.write(json.dumps(result) if options["json"] else bench_against.format_table(result))
