"""Write curated tasks as JSON (the format import_tasks reads)."""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from votes import selectors
from votes.models import Task


class Command(BaseCommand):
    help = "Export tasks (all, or those named with --task) as JSON to stdout or --output."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", action="append", default=[], help="A task's slug; repeatable.")
        parser.add_argument("--output", help="A file to write instead of stdout.")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks = Task.objects.order_by("slug")
        if options["task"]:
            tasks = tasks.filter(slug__in=options["task"])
            missing = sorted(set(options["task"]) - set(tasks.values_list("slug", flat=True)))
            if missing:
                raise CommandError(f"No task with slug {', '.join(missing)}.")
        text = json.dumps(selectors.export_tasks(tasks), indent=2, ensure_ascii=False) + "\n"
        if options["output"]:
            try:
                Path(options["output"]).write_text(text, encoding="utf-8")
            except OSError as error:
                raise CommandError(f"Cannot write {options['output']}: {error.strerror}.") from None
        else:
            self.stdout.write(text, ending="")
