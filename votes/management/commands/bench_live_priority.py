"""python manage.py bench_live_priority [--task T] [--live NAME ...] [--evaluate NAME ...] [--replies N] [--json F]"""

import dataclasses
import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.models import LLM
from votes import bench_live_priority
from votes.models import Task


class Command(BaseCommand):
    help = (
        "What an evaluation run costs a live reply: the same live replies, in this process on warm "
        "engines, alone, beside a real evaluation run on its background lane, and beside the same "
        "run sent as live replies; reports each way's median tokens/s and its ratio to alone."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", default="calendar", help="The task whose first prompt the live replies answer.")
        parser.add_argument(
            "--live", nargs="+", help="Models of the live replies (default: the anonymous roster's first)."
        )
        parser.add_argument(
            "--evaluate", nargs="+", help="Models of the evaluation (default: the anonymous roster's others)."
        )
        parser.add_argument("--replies", type=int, default=5, help="Live replies per model and way.")
        parser.add_argument("--json", type=Path, help="Also write the report to this file.")
        parser.add_argument(
            "--no-warm-up",
            action="store_true",
            help="Skip compiling every shape first (a smoke run: the timed replies then compile).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["replies"] < 1:
            raise CommandError("--replies must be at least 1.")
        task = Task.objects.filter(slug=options["task"]).first()
        if task is None:
            raise CommandError(f"No task {options['task']!r}: import the bundled ones (manage.py import_tasks).")
        roster = list(LLM.objects.anonymous().order_by("name"))
        live = self._models(options["live"]) if options["live"] else roster[:1]
        # By default the other models: an evaluation reply in the live reply's own engine rides
        # in its decode batch for nothing; one in another engine competes for the cores.
        others = [model for model in roster if model not in live] or roster
        evaluated = self._models(options["evaluate"]) if options["evaluate"] else others
        if not live or not evaluated:
            raise CommandError("No models: name them with --live and --evaluate, or enable some for anonymous battles.")
        try:
            report = bench_live_priority.measure(
                task,
                live,
                evaluated,
                replies=options["replies"],
                warm_up=not options["no_warm_up"],
                on_progress=lambda line: self.stderr.write(line),
            )
        except (RuntimeError, ValueError) as error:
            raise CommandError(str(error)) from error
        for way in bench_live_priority.WAYS:
            steps = report.evaluation_steps.get(way)
            during = "" if steps is None else f" (the evaluation did {steps} step{'' if steps == 1 else 's'} meanwhile)"
            self.stdout.write(
                f"{way}: median {report.median_speed(way):.1f} tokens/s, first token "
                f"{report.median_first_token(way):.2f} s, {report.ratio(way):.2f}x alone{during}"
            )
        if options["json"]:
            summary = {
                way: {
                    "median_tokens_per_s": report.median_speed(way),
                    "median_first_token_s": report.median_first_token(way),
                    "ratio_to_alone": report.ratio(way),
                    "evaluation_steps": report.evaluation_steps.get(way),
                    "replies": [dataclasses.asdict(reply) for reply in report.replies[way]],
                }
                for way in bench_live_priority.WAYS
            }
            options["json"].write_text(json.dumps(summary, indent=2))

    def _models(self, names: list[str]) -> list[LLM]:
        found = {model.name: model for model in LLM.objects.filter(name__in=names, enabled=True)}
        missing = [name for name in names if name not in found]
        if missing:
            raise CommandError(f"No enabled model named {', '.join(missing)}.")
        return [found[name] for name in names]
