"""Rate fix episodes (a JSON or JSON Lines file) with the site's fix-ability model."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard import board, fixing
from leaderboard.management.input_files import read_input

JSON_FIELDS = ("model", "rating", "lower", "upper", "fix_rate", "episodes")


class Command(BaseCommand):
    help = (
        "Read fix episodes (a JSON list or JSON Lines of {model, task, turn, fixed, battle?, feedback_kind?, "
        "decoy?}) and print the fix-ability ratings: a logistic regression of fixed on model and task-turn "
        "difficulty, with intervals clustered by battle, beside the raw fix rate and the number of episodes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="The episodes file; - reads stdin.")
        parser.add_argument("--json", action="store_true", help="Print a JSON list instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["file"]
        text = read_input(name)
        try:
            episodes = fixing.episodes_from_records(board.read_records(text, "fix episodes"))
        except ValueError as error:  # BattleFileError included.
            raise CommandError(f"{name}: {error}") from None
        rows = fixing.rate_fixes(episodes)
        if options["json"]:
            records = [{field: getattr(row, field) for field in JSON_FIELDS} for row in rows]
            self.stdout.write(json.dumps(records, indent=2))
            return
        self.stdout.write(f"{len(episodes)} fix episodes, {len(rows)} models; 95% intervals clustered by battle")
        header = f"{'rank':>4}  {'model':<32} {'rating':>7} {'95% interval':>17} {'fix rate':>17} {'episodes':>8}"
        self.stdout.write(header)
        for row in rows:
            interval = f"{row.lower:.1f}-{row.upper:.1f}"
            rate = f"{row.fix_rate:.0%} ({row.fix_lower:.0%}-{row.fix_upper:.0%})"
            self.stdout.write(
                f"{row.rank:>4}  {row.model:<32} {row.rating:>7.1f} {interval:>17} {rate:>17} {row.episodes:>8}"
            )
