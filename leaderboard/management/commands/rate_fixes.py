"""Rate fix episodes (a JSON or JSON Lines file) with the site's fix-ability model."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard import board, fixing
from leaderboard.management.input_files import read_input

JSON_FIELDS = ("model", "rating", "lower", "upper", "open_ended", "fix_rate", "episodes")


class Command(BaseCommand):
    help = (
        "Read fix episodes (a JSON list or JSON Lines of {model, fixed, task?, turn?, battle?, feedback_kind? "
        "(or specificity?), attempt?, decoy?}; no task: free chat) and print the fix-ability ratings: a logistic "
        "regression of fixed on the model, the task turn's difficulty (free chat: the battle's, conditioned out), "
        "the correction's kind and the attempt, with intervals clustered by battle (open-ended for a model with no "
        "fix, or no failure), beside the raw fix rate and the number of episodes."
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
            if row.rating is None:
                rank, rating, interval = "-", "-", "unrated"
            else:
                low, high = (f"{bound:.1f}" if bound is not None else "open" for bound in (row.lower, row.upper))
                rank, rating, interval = str(row.rank), f"{row.rating:.1f}", f"{low}-{high}"
            rate = f"{row.fix_rate:.0%} ({row.fix_lower:.0%}-{row.fix_upper:.0%})"
            note = f"  {row.open_ended}" if row.open_ended else ""
            self.stdout.write(
                f"{rank:>4}  {row.model:<32} {rating:>7} {interval:>17} {rate:>17} {row.episodes:>8}{note}"
            )
