import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import registry
from inference.building import fixer

# The default contestant's committed weights (tests and set-up name them).
DEFAULT_WEIGHTS = fixer.DEFAULT_FIXER.weights


class Command(BaseCommand):
    help = (
        "LoRA-fine-tune one of the arena's fine-tuned contestants (--model; default the SmolLM2 fixer) on "
        "seed-shaped calendar dialogs (mistakes, corrections of three kinds, false corrections), write its LoRA "
        "weights, and measure first-try, fix and capitulation rates and the seed dialog against its base model."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--model", choices=sorted(fixer.FIXERS), default=fixer.DEFAULT_FIXER.name, help="Which contestant."
        )
        parser.add_argument(
            "--base", type=Path, help="Its imported base preset (default: ARENA_IMPORTED_PRESETS_DIR/<its base>)."
        )
        parser.add_argument("--weights", type=Path, help="Where the LoRA weights go (default: inference/fixer/).")
        parser.add_argument("--steps", type=int, help="Training steps (default: the model's own).")
        parser.add_argument("--batch-size", type=int, default=fixer.BATCH_SIZE)
        parser.add_argument("--examples", type=int, default=fixer.EXAMPLES)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--evaluate", type=int, default=100, metavar="N", help="Held-out items per measure (0: no evaluation)."
        )
        parser.add_argument("--skip-base", action="store_true", help="Evaluate the fine-tuned model only.")

    def handle(self, *args: object, **options: object) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        spec = fixer.FIXERS[str(options["model"])]
        base = Path(str(options["base"] or Path(settings.ARENA_IMPORTED_PRESETS_DIR) / spec.base))
        if not (base / "config.json").is_file():
            raise CommandError(f"{base} is not a preset; import it first (scripts/serve imports the real models).")
        weights = Path(str(options["weights"] or spec.weights))
        if not weights.name.endswith(".lora.h5"):
            raise CommandError("--weights must end in .lora.h5 (keras-hub's LoRA weights format).")
        steps = int(options["steps"] or spec.steps)  # type: ignore[call-overload]
        columns = (TextColumn(f"{spec.name}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                   TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())  # fmt: skip
        with Progress(*columns, console=None) as progress:
            task = progress.add_task("fine-tuning", total=steps, loss=float("nan"))
            report = fixer.finetune_fixer(
                spec,
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
            tuned_dir = Path(settings.ARENA_IMPORTED_PRESETS_DIR) / f".{spec.name}-evaluation"
            fixer.build_fixer_preset(spec, base, weights, tuned_dir, report.__dict__)
            models = [("fine-tuned", tuned_dir, spec.family)]
            if not options["skip_base"]:
                models.insert(0, ("base", base, registry.read_preset(base).family))
            for name, preset, family in models:
                self.stdout.write(f"Evaluating the {name} model on {n} held-out items per measure ...")
                measured = fixer.evaluate_fixing(fixer.load_base(preset), family, n=n, seed=int(options["seed"]))  # type: ignore[call-overload]
                self.stdout.write(f"  {name}: {measured.summary()}")
                summary[name] = measured.as_dict()
        report_path = weights.with_name(weights.name.removesuffix(".lora.h5") + ".report.json")
        report_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        self.stdout.write(f"Report -> {report_path}")
