"""Rate a public arena's battles (clean_battle format) with this arena's statistics."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaderboard import board, ratings, style
from leaderboard.management.input_files import read_input


class Command(BaseCommand):
    help = (
        "Read battles (a JSON list or JSON Lines of {model_a, model_b, winner, tstamp?}) and print the "
        "leaderboard: Bradley-Terry with intervals, interval-aware rank, votes, online Elo and the votes whose "
        "removal would swap each model with the next one down."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="The battles file; - reads stdin.")
        parser.add_argument("--rounds", type=int, default=1000, help="Bootstrap rounds (default 1000).")
        parser.add_argument(
            "--ci",
            choices=(*board.CI_METHODS, board.CLUSTERED),
            default=None,
            help="Interval method: clustered (by voter: the records' judge; the default when every record names "
            "one, as the site's boards do), bootstrap (the default otherwise) or sandwich (votes taken as "
            "independent).",
        )
        parser.add_argument("--seed", type=int, default=0, help="Bootstrap seed (default 0).")
        parser.add_argument("--json", action="store_true", help="Print a JSON list instead of a table.")
        parser.add_argument(
            "--style-control",
            action="store_true",
            help="Control for style: the length and markdown differences of each battle's conv_metadata "
            "(LMArena's releases, this arena's dumps) as covariates; --ci intervals, no Elo.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rounds"] < 1:
            raise CommandError("--rounds must be at least 1.")
        name = options["file"]
        text = read_input(name)
        try:
            records = board.read_battles(text)
            names, games = board.games_from_battles(records)
            styled = board.style_votes_from_battles(records, names) if options["style_control"] else None
        except board.BattleFileError as error:
            raise CommandError(f"{name}: {error}") from None
        voters = board.voters_from_battles(records, names)
        if styled is not None:
            if options["ci"] == board.CLUSTERED:
                raise CommandError("--style-control takes --ci bootstrap or sandwich.")
            options["ci"] = options["ci"] or "bootstrap"
            self._style_controlled(names, styled, options)
            return
        if options["ci"] is None:
            options["ci"] = board.CLUSTERED if voters is not None else "bootstrap"
        if options["ci"] == board.CLUSTERED and voters is None:
            raise CommandError(f"{name}: --ci clustered needs a judge (the voter) in every record.")
        rows = board.compute_board(
            names,
            ratings.PairOutcomes.from_games(len(names), games),
            elo=ratings.online_elo(len(names), games),
            ci=options["ci"],
            voters=voters,
            rounds=options["rounds"],
            seed=options["seed"],
        )
        if options["json"]:
            self.stdout.write(json.dumps([row.as_dict() for row in rows], indent=2))
            return
        self.stdout.write(f"{len(games)} battles, {len(names)} models; 95% {options['ci']} intervals")
        groups = len({row.group for row in rows})
        if groups > 1:
            self.stdout.write(f"{groups} groups of models that never met: each rated and ranked on its own.")
        self.stdout.write(
            f"{'group':>5} {'rank':>4}  {'model':<32} {'rating':>7} {'95% interval':>22} {'votes':>7} {'elo':>7}"
            f" {'swap':>6}"
        )
        for row in rows:
            interval = (
                board.interval_text(row.as_dict())
                if row.lower_open or row.upper_open
                else f"{row.lower:.1f}-{row.upper:.1f}"
            )
            swap = "" if row.swap_votes is None else str(row.swap_votes)
            self.stdout.write(
                f"{row.group:>5} {row.rank:>4}  {row.model:<32} {row.rating:>7.1f} {interval:>22} {row.votes:>7}"
                f" {row.elo:>7.1f} {swap:>6}"
            )
        self.stdout.write(
            "swap: votes whose removal would swap the model with the next one down (an upper bound of the "
            "fewest; leaderboard.fragility)."
        )

    def _style_controlled(self, names: list[str], votes: list, options: dict[str, Any]) -> None:
        rows, coefficients = board.compute_style_board(
            names,
            style.StyleOutcomes.from_votes(len(names), votes),
            ci=options["ci"],
            rounds=options["rounds"],
            seed=options["seed"],
        )
        if options["json"]:
            payload = {"rows": [row.as_dict() for row in rows], "coefficients": coefficients}
            self.stdout.write(json.dumps(payload, indent=2))
            return
        self.stdout.write(f"{len(votes)} battles, {len(names)} models; style-controlled, 95% {options['ci']} intervals")
        self.stdout.write(f"{'rank':>4}  {'model':<32} {'rating':>7} {'95% interval':>22} {'votes':>7}")
        for row in rows:
            interval = (
                board.interval_text(row.as_dict())
                if row.lower_open or row.upper_open
                else f"{row.lower:.1f}-{row.upper:.1f}"
            )
            self.stdout.write(f"{row.rank:>4}  {row.model:<32} {row.rating:>7.1f} {interval:>22} {row.votes:>7}")
        for feature, value in coefficients.items():
            self.stdout.write(
                f"style coefficient {feature}: {value['value']:.3f} ({value['lower']:.3f} to {value['upper']:.3f}) "
                "log-odds per unit of normalised difference"
            )
