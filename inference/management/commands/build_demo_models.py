"""Build the bundled demo models (see inference.demo_models) as keras-hub preset folders.

Without ``--train``: the tiny random-weight presets (tiny-gemma, tiny-llama3), in seconds.
With ``--train``: the trained calendar-assistant presets (gemma-calendar, llama3-calendar,
mistral-calendar), trained from scratch in under 15 minutes on two CPU cores, evaluated on
held-out data, with the measured quality written to each preset's metadata.json and to
QUALITY.md. The same seed gives the same data, tokenizers, initial weights and batch order.
"""

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "presets"


class Command(BaseCommand):
    help = (
        "Without --train: build the tiny random-weight Gemma and Llama 3 presets (seconds). "
        "With --train: train the calendar-assistant demo models from scratch (gemma-calendar: "
        "strong; llama3-calendar: medium, chatty; mistral-calendar: weak, sloppy), about 10-15 "
        "minutes on 2 CPU cores, evaluate them on held-out data and record the measured quality "
        "in each preset's metadata.json and in QUALITY.md. Reproducible for a given --seed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder to write presets into.")
        parser.add_argument("--seed", type=int, default=0, help="Seed for data, tokenizers, weights and batch order.")
        parser.add_argument(
            "--train", action="store_true", help="Train the calendar-assistant presets instead of the tiny random ones."
        )
        parser.add_argument(
            "--only",
            action="append",
            metavar="NAME",
            help="With --train: train only this preset (repeatable); QUALITY.md is then left as it is.",
        )
        parser.add_argument(
            "--eval-n", type=int, default=100, help="With --train: held-out items per evaluation set (default 100)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: keras and jax take seconds to import, and other commands must not pay it.
        from inference.demo_models import build_demo_models, iter_preset_files

        out = Path(options["out"])
        if not options["train"]:
            if options["only"]:
                raise CommandError("--only needs --train.")
            for path in build_demo_models(out, seed=options["seed"]):
                self._report_size(path, iter_preset_files)
            return
        self._train(out, options)

    def _report_size(self, path: Path, iter_preset_files: Any) -> None:
        size = sum(f.stat().st_size for f in iter_preset_files(path))
        self.stdout.write(f"Wrote {path} ({size / 1e6:.1f} MB)")

    def _train(self, out: Path, options: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from inference.demo_models import TRAINED_MODEL_SPECS, iter_preset_files, train_demo_models

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
