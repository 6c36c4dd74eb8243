"""Run an automatic evaluation of models on a task, here and now, with a progress bar."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from inference.models import LLM
from votes import evaluation_services, selectors
from votes.models import Task


class Command(BaseCommand):
    help = (
        "Evaluate models on a task like the seed experiment: reliability, the complete dialog with "
        "corrections, fixing other models' mistakes; then false corrections (discernment) and three kinds of "
        "feedback on the same mistakes. Stores the run; prints its recap."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", required=True, help="The task's slug, e.g. calendar.")
        parser.add_argument("--models", nargs="+", help="Roster names (default: every enabled model).")
        parser.add_argument("--attempts", type=int, default=5, help="Reliability attempts (default 5).")
        parser.add_argument("--max-tries", type=int, default=3, help="Corrections per dialog turn (default 3).")
        parser.add_argument("--fix-attempts", type=int, default=3, help="Fixing attempts (default 3).")
        parser.add_argument(
            "--decoys", type=int, default=3, help="False corrections after correct replies (discernment; default 3)."
        )
        parser.add_argument(
            "--feedback-mistakes",
            type=int,
            default=2,
            help="Own mistakes corrected three ways: generic, human, checker (default 2).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the finished run as one JSON object (per model: dialog turns ✓ or 🥦, reliability, "
            "fix-ability with its interval, fixes per kind of feedback, discernment) instead of the recap.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task = Task.objects.filter(slug=options["task"]).first()
        if task is None:
            known = ", ".join(Task.objects.order_by("slug").values_list("slug", flat=True)) or "none"
            raise CommandError(f"No task {options['task']!r} (known: {known}).")
        if options["models"]:
            llms = list(LLM.objects.filter(name__in=options["models"]))
            missing = sorted(set(options["models"]) - {llm.name for llm in llms})
            if missing:
                raise CommandError(f"No model named {', '.join(missing)} in the roster.")
        else:
            llms = list(LLM.objects.enabled())
        try:
            run = evaluation_services.create_evaluation(
                task=task,
                llms=llms,
                attempts=options["attempts"],
                max_tries=options["max_tries"],
                fix_attempts=options["fix_attempts"],
                decoys=options["decoys"],
                feedback_mistakes=options["feedback_mistakes"],
            )
        except ValueError as error:
            raise CommandError(str(error)) from None
        with tqdm(total=run.total, desc=f"evaluation {run.pk}", unit="step", file=self.stderr) as bar:
            run = evaluation_services.run_evaluation(run.pk, on_step=lambda: bar.update(1))
        if run.status != run.Status.DONE:
            raise CommandError(f"Evaluation {run.pk} failed: {run.error}")
        if options["json"]:
            self.stdout.write(json.dumps(selectors.evaluation_summary(run), ensure_ascii=False))
            return
        self.stdout.write(f"Evaluation {run.pk} of {task.slug}: /evaluations/{run.pk}/")
        self.stdout.write(f"{'rank':<5} {'model':<24} {'✓':>3} {'🥦':>3} {'🍄':>3} {'🔥':>3}")
        for row in selectors.evaluation_report(run).recap:
            self.stdout.write(
                f"{row['rank']:<5} {row['model']:<24} {row['correct']:>3} {row['fixed']:>3} "
                f"{row['mistake']:>3} {row['garbage']:>3}"
            )
