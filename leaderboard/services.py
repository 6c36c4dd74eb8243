"""Writes for the leaderboard: recomputing every category into a snapshot."""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from leaderboard import anomaly, board, fixing, ratings, selectors
from leaderboard.models import LeaderboardRefresh, LeaderboardSnapshot
from votes import services as votes_services
from votes.models import Battle, FlaggedVoter, Task, Vote


class Stopwatch:
    """Seconds spent per named stage, added up over the ``with stopwatch("stage"):`` blocks."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - began


@transaction.atomic
def refresh_leaderboard(*, rounds: int | None = None, seed: int = 0) -> LeaderboardRefresh:
    """Recompute every category (ratings, intervals, ranks, Elo, matrices, fix rates) and store
    the snapshots of one refresh."""
    started = time.perf_counter()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # Until the transaction ends (SET LOCAL).
            cursor.execute("SELECT set_config('work_mem', %s, true)", [settings.LEADERBOARD_WORK_MEM])
    stopwatch = Stopwatch()
    with stopwatch("anomaly detection"):
        flag_anomalous_voters()
    previous = selectors.latest_refresh()
    with stopwatch("fix episodes"):
        episodes_through = Battle.objects.filter(state=Battle.State.ENDED).aggregate(last=Max("ended"))["last"]
        votes_services.record_fix_episodes(ended_after=_episodes_ended_after(previous))
    rounds = settings.LEADERBOARD_BOOTSTRAP_ROUNDS if rounds is None else rounds
    names = selectors.roster_names()
    last_vote = Vote.objects.aggregate(last=Max("pk"))["last"] or 0
    earlier = {s.category: s for s in previous.snapshots.all()} if previous else {}
    refresh = LeaderboardRefresh.objects.create(last_vote_id=last_vote, episodes_through=episodes_through)
    with stopwatch("fix rates"):
        fixes = selectors.fix_rates(names)
    provisional_below = settings.LEADERBOARD_PROVISIONAL_VOTES
    with stopwatch("votes to pair counts"):
        tally = selectors.vote_tally(names)  # Every board, and what each leaves out, in one pass.
    for position, (category, title) in enumerate(selectors.categories()):
        if category in selectors.EPISODE_CATEGORIES:
            with stopwatch("fix-ability"):
                _fixing_snapshot(refresh, position, category, title, provisional_below)
            continue
        before = earlier.get(category)
        marker = (before.elo_through_ended, before.elo_through_vote) if before else None
        board_votes = tally.boards.get(category, selectors.BoardCounts({}, {}, 0))
        with stopwatch("votes to pair counts"):
            data = selectors.category_data(category, names, marker, board_votes)
            if before is not None and data.counted_before != before.elo_votes:
                # Votes were excluded (a flagged voter, a leak) or let back in since the last
                # refresh: online Elo cannot take a vote back, so it starts again from all of them.
                before, data = None, selectors.category_data(category, names, None, board_votes)
        with stopwatch("online Elo"):
            # Online Elo goes on from the previous refresh with the votes counted since.
            start = np.array([(before.elo_state if before else {}).get(name, ratings.BASE_RATING) for name in names])
            elo = ratings.online_elo(len(names), data.new_games, k=settings.LEADERBOARD_ELO_K, start=start)
        with stopwatch("ratings and intervals"):
            rows = board.compute_board(
                names, data.outcomes, elo=elo, rounds=rounds, seed=seed, pair_weights=data.pair_weights
            )
        # Style control for the overall board: a toggle on the page, with its coefficients.
        with stopwatch("style control"):
            style_rows, style_coefficients = (
                board.compute_style_board(names, selectors.style_outcomes(category, names))
                if category == selectors.OVERALL
                else ([], {})
            )
        # The matrices cover the rated models only, in rank order, as the table lists them.
        rated = [row.model for row in rows]
        index = [names.index(name) for name in rated]
        played = data.outcomes.restricted(np.isin(np.arange(len(names)), index))
        order = np.argsort(np.argsort(index))  # Positions of the rated models in name order.
        fractions = ratings.win_fraction_matrix(played)[np.ix_(order, order)]
        counts = played.games()[np.ix_(order, order)]
        excluded = tally.excluded(category)
        LeaderboardSnapshot.objects.create(
            refresh=refresh,
            position=position,
            category=category,
            title=title,
            votes=round(data.outcomes.total),
            pair_weighted=data.pair_weights is not None,
            rows=[
                {
                    **row.as_dict(),
                    "provisional": row.votes < provisional_below,
                    "fix_rate": _fix_rate(fixes[row.model]["voters"]),
                    "checker_fix_rate": _fix_rate(fixes[row.model]["checker"]),
                }
                for row in rows
            ],
            unrated=board.unrated(names, data.outcomes),
            excluded=excluded,
            model_names=rated,
            win_fractions=[[None if math.isnan(v) else round(float(v), 4) for v in line] for line in fractions],
            battle_counts=counts.astype(int).tolist(),
            elo_state={name: float(value) for name, value in zip(names, elo, strict=True)},
            elo_through_ended=data.elo_through[0],
            elo_through_vote=data.elo_through[1],
            elo_votes=data.counted_before + len(data.new_games),
            style_rows=[{**row.as_dict(), "provisional": row.votes < provisional_below} for row in style_rows],
            style_coefficients=style_coefficients,
        )
    refresh.seconds = time.perf_counter() - started
    refresh.stages = {stage: round(seconds, 4) for stage, seconds in stopwatch.seconds.items()}
    refresh.save(update_fields=["seconds", "stages"])
    return refresh


# Battles that ended this long before the previous refresh's newest are read again: a battle
# that ended just before that refresh may have been committed just after it read them.
EPISODES_MARGIN = timedelta(minutes=5)


def _episodes_ended_after(previous: LeaderboardRefresh | None) -> datetime | None:
    """From when the battles' fix episodes must be read again (None: all of them, when there is
    no earlier refresh to go on from or a task changed since, its correction turns perhaps)."""
    if previous is None or previous.episodes_through is None:
        return None
    if Task.objects.filter(updated__gte=previous.created).exists():
        return None
    return previous.episodes_through - EPISODES_MARGIN


def _fixing_snapshot(
    refresh: LeaderboardRefresh, position: int, category: str, title: str, provisional_below: int
) -> LeaderboardSnapshot:
    """The "Fixing mistakes" board: fix-ability from the counted fix episodes (leaderboard.fixing)."""
    episodes = selectors.counted_episodes()
    rows = fixing.rate_fixes(episodes)
    return LeaderboardSnapshot.objects.create(
        refresh=refresh,
        position=position,
        category=category,
        title=title,
        votes=len(episodes),
        method="fix-ability",
        rows=[{**row.as_dict(), "provisional": row.episodes < provisional_below} for row in rows],
        unrated=[name for name in selectors.roster_names() if name not in {row.model for row in rows}],
        excluded=selectors.excluded_episodes(),
    )


def flag_anomalous_voters() -> list[FlaggedVoter]:
    """Flag the voters whose votes are anomalous (leaderboard.anomaly) among the votes of ended
    battles by voters not flagged yet; a flag an admin cleared is never set again."""
    found = anomaly.suspicious_voters(
        anomaly.VoteTable.from_rows(selectors.anomaly_rows()),
        alpha=settings.LEADERBOARD_ANOMALY_ALPHA,
        min_votes=settings.LEADERBOARD_ANOMALY_MIN_VOTES,
    )
    known = set(FlaggedVoter.objects.filter(voter_key__in=[a.voter for a in found]).values_list("voter_key", flat=True))
    flags = [
        FlaggedVoter(
            voter_key=a.voter,
            reason=a.reason(),
            source=FlaggedVoter.Source.AUTOMATIC,
            p_value=a.p_value,
        )
        for a in found
        if a.voter not in known
    ]
    return FlaggedVoter.objects.bulk_create(flags, ignore_conflicts=True)


def _fix_rate(rate: ratings.FixRate) -> dict[str, float | int | None]:
    return {
        "fixed": rate.fixed,
        "corrections": rate.corrections,
        "rate": rate.rate,
        "lower": round(rate.lower, 4),
        "upper": round(rate.upper, 4),
    }


def refresh_if_due() -> LeaderboardRefresh | None:
    """Refresh when the latest refresh is older than LEADERBOARD_REFRESH_SECONDS or
    LEADERBOARD_REFRESH_VOTES votes have arrived since (beat calls this every minute)."""
    latest = selectors.latest_refresh()
    if latest is not None:
        age = (timezone.now() - latest.created).total_seconds()
        new_votes = selectors.new_votes_since(latest)
        if new_votes == 0 or (
            age < settings.LEADERBOARD_REFRESH_SECONDS and new_votes < settings.LEADERBOARD_REFRESH_VOTES
        ):
            return None
    return refresh_leaderboard()
