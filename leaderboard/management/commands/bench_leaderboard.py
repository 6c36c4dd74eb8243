"""Benchmark the leaderboard refresh on synthetic votes (see leaderboard.bench), from arrays or,
with --from-database, from a scratch PostgreSQL database (see leaderboard.bench_database)."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard import bench, bench_database


class Command(BaseCommand):
    help = "Time the whole leaderboard refresh on synthetic votes against a per-round logistic regression."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--votes", type=int, default=1_000_000)
        parser.add_argument("--models", type=int, default=40)
        parser.add_argument("--rounds", type=int, default=1000, help="Bootstrap rounds.")
        parser.add_argument("--reference-rounds", type=int, default=2, help="Rounds of the reference actually run.")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--repeats", type=int, default=5, help="Whole refreshes timed, from arrays; the median is quoted."
        )
        parser.add_argument(
            "--busy",
            type=int,
            default=0,
            metavar="N",
            help="Time the repeats again while N processes spin on the CPU cores (started before, ended after); "
            "both figures are reported.",
        )
        parser.add_argument(
            "--from-database",
            action="store_true",
            help="Store the votes in a scratch PostgreSQL database (created and dropped) and time the site's refresh.",
        )
        parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["votes"] < 1 or options["models"] < 2 or options["rounds"] < 1 or options["reference_rounds"] < 0:
            raise CommandError("Need --votes >= 1, --models >= 2, --rounds >= 1 and --reference-rounds >= 0.")
        if options["repeats"] < 1:
            raise CommandError("Need --repeats >= 1.")
        if options["busy"] < 0:
            raise CommandError("Need --busy >= 0.")
        if options["busy"] and options["from_database"]:
            raise CommandError("--busy times the refresh from arrays: not with --from-database.")
        if options["from_database"]:
            try:
                result = bench_database.run_database_bench(
                    votes=options["votes"], models=options["models"], rounds=options["rounds"], seed=options["seed"]
                )
            except ValueError as error:
                raise CommandError(str(error)) from None
            self.stdout.write(json.dumps(result, indent=2) if options["json"] else bench_database.format_table(result))
            return
        result = bench.run_bench(
            votes=options["votes"],
            models=options["models"],
            rounds=options["rounds"],
            reference_rounds=options["reference_rounds"],
            seed=options["seed"],
            repeats=options["repeats"],
            busy_processes=options["busy"],
        )
        self.stdout.write(json.dumps(result, indent=2) if options["json"] else bench.format_table(result))
