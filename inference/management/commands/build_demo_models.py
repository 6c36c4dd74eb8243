"""Build the bundled demo models (see inference.building.demo_models) as keras-hub preset folders.

By default: the trained calendar-assistant presets (gemma-calendar, mistral-calendar,
llama3-calendar) in inference/presets, trained from scratch in under 15 minutes on two CPU
cores, evaluated on held-out data, with the measured quality written to each preset's
metadata.json and to QUALITY.md. The same seed gives the same data, tokenizers, initial weights
and batch order. With ``--tiny``: the random-weight test fixtures (tiny-gemma, tiny-llama3) in
tests/fixtures/presets, in seconds.
"""

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO_ROOT / "inference" / "presets"
TINY_OUT = REPO_ROOT / "tests" / "fixtures" / "presets"


class Command(BaseCommand):
    help = (
        "Train the calendar-assistant demo models from scratch (gemma-calendar: strong; "
        "mistral-calendar: medium, chatty; llama3-calendar: weak, sloppy), under 15 minutes on 2 "
        "CPU cores, evaluate them on held-out data and record the measured quality in each "
        "preset's metadata.json and in QUALITY.md. Reproducible for a given --seed. With --tiny: "
        "build the tiny random-weight test presets instead (seconds)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--out",
            type=Path,
            default=None,
            help=f"Folder to write presets into (default {DEFAULT_OUT}; with --tiny {TINY_OUT}).",
        )
        parser.add_argument("--seed", type=int, default=0, help="Seed for data, tokenizers, weights and batch order.")
        parser.add_argument(
            "--tiny", action="store_true", help="Build the tiny random-weight test presets instead of training."
        )
        parser.add_argument(
            "--only",
            action="append",
            metavar="NAME",
            help="Train only this preset (repeatable); QUALITY.md still lists every trained preset in the folder.",
        )
        parser.add_argument("--eval-n", type=int, default=100, help="Held-out items per evaluation set (default 100).")

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: keras and jax take seconds to import, and other commands must not pay it.
        from inference.building.demo_models import build_tiny_models, iter_preset_files

        if options["tiny"]:
            if options["only"]:
                raise CommandError("--only applies to the trained presets, not to --tiny.")
            for path in build_tiny_models(Path(options["out"] or TINY_OUT), seed=options["seed"]):
                self._report_size(path, iter_preset_files)
            return
        if options["eval_n"] < 1:
            raise CommandError("--eval-n must be at least 1.")
        self._train(Path(options["out"] or DEFAULT_OUT), options)

    def _report_size(self, path: Path, iter_preset_files: Any) -> None:
        size = sum(f.stat().st_size for f in iter_preset_files(path))
        self.stdout.write(f"Wrote {path} ({size / 1e6:.1f} MB)")

    def _train(self, out: Path, options: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from inference.building.demo_models import TRAINED_MODEL_SPECS, iter_preset_files, train_demo_models

        known = {spec.name: spec for spec in TRAINED_MODEL_SPECS}
        names = options["only"]
        unknown = sorted(set(names or ()) - set(known))
        if unknown:
            raise CommandError(f"Unknown preset(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
        console = Console(file=self.stdout._out, force_terminal=None)  # type: ignore[attr-defined]
        started = time.monotonic()
        with Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            tasks = {
                name: progress.add_task(name, total=spec.steps, loss=float("nan"))
                for name, spec in known.items()
                if names is None or name in names
            }

            def on_step(name: str, step: int, total: int, loss: float) -> None:
                progress.update(tasks[name], completed=step, loss=loss)
                # Piped to a file or a CI log, the bar is drawn only at the end: log each tenth.
                if not console.is_terminal and (step % max(1, total // 10) == 0 or step == total):
                    elapsed = time.monotonic() - started
                    progress.console.print(f"{name}: step {step}/{total}, loss {loss:.4f}, {elapsed:.0f} s elapsed")

            def on_evaluated(name: str, report: Any) -> None:
                progress.console.print(
                    f"{name}: first requests {report.first_requests:.0%}, corrections fixed "
                    f"{report.corrections:.0%}, follow-ups {report.followups:.0%} (held-out, n={report.n})"
                )

            written = train_demo_models(
                out,
                seed=options["seed"],
                names=names,
                n_eval=options["eval_n"],
                on_step=on_step,
                on_evaluated=on_evaluated,
            )
        for path in written:
            self._report_size(path, iter_preset_files)
        self.stdout.write(f"Done in {time.monotonic() - started:.0f} s.")
