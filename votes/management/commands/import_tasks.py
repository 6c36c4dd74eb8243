"""Create or replace curated tasks from a JSON file (the format export_tasks writes)."""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from votes import services

BUNDLED_TASKS = Path(__file__).resolve().parents[2] / "fixtures" / "tasks.json"


class Command(BaseCommand):
    help = "Import tasks from JSON (default: the bundled tasks). Tasks are matched by slug and replaced."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", default=str(BUNDLED_TASKS), help="A JSON file; - reads stdin.")
        parser.add_argument(
            "--keep-existing", action="store_true", help="Leave tasks whose slug already exists untouched."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["file"]
        try:
            text = self.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            data = json.loads(text)
        except OSError as error:
            raise CommandError(f"Cannot read {name}: {error.strerror}.") from None
        except ValueError as error:
            raise CommandError(f"{name} is not valid JSON: {error}.") from None
        try:
            imported = services.import_tasks(data, keep_existing=options["keep_existing"])
        except services.TaskImportError as error:
            raise CommandError(f"{name}: {error} Nothing was imported.") from None
        listed = ", ".join(task.slug for task in imported) or "none (all exist)"
        self.stdout.write(f"Imported {len(imported)} task(s): {listed}.")
