"""Writes for the leaderboard: recomputing every category into a snapshot."""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone
from prometheus_client import Histogram
from threadpoolctl import threadpool_limits

from leaderboard import anomaly, board, fixing, ratings, selectors, tally
from leaderboard.models import LeaderboardRefresh, LeaderboardSnapshot, VoteTallyState
from votes import services as votes_services
from votes.models import Battle, FlaggedNetwork, FlaggedVoter, FlagSource, Task, Vote

# Seconds per refresh, and per stage of it (Stopwatch's stages); recorded by the process that ran
# it (the default Celery worker from beat, or the web tier when no refresh exists yet).
REFRESH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
REFRESH_SECONDS = Histogram(
    "arena_leaderboard_refresh_seconds", "Duration of each leaderboard refresh.", buckets=REFRESH_BUCKETS
)
REFRESH_STAGE_SECONDS = Histogram(
    "arena_leaderboard_refresh_stage_seconds",
    "Duration of each stage of a leaderboard refresh.",
    ["stage"],
    buckets=REFRESH_BUCKETS,
)


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


# BLAS keeps to one thread for every stage of the refresh: it runs beside the web tier, the
# workers and its own bootstrap threads, and a BLAS thread pool on a busy core waits for the
# slowest of its threads (the fix-ability's 50k x 70 product: 1.04 s with two threads on a busy
# 2-core machine, 0.02 s with one). Applied when the refresh is called, to every BLAS loaded then.
@threadpool_limits.wrap(limits=1, user_api="blas")
@transaction.atomic
def refresh_leaderboard(*, rounds: int | None = None, seed: int = 0, recount: bool = False) -> LeaderboardRefresh:
    """Recompute every category (ratings, intervals, ranks, Elo, matrices, fix rates) and store
    the snapshots of one refresh. The votes come from the running counts (leaderboard.tally) and
    the battles ended since the last refresh; ``recount``: from every vote again."""
    started = time.perf_counter()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # Until the transaction ends (SET LOCAL).
            cursor.execute("SELECT set_config('work_mem', %s, true)", [settings.LEADERBOARD_WORK_MEM])
    stopwatch = Stopwatch()
    previous = selectors.latest_refresh()
    with stopwatch("fix episodes"):
        state = _locked_tally_state()
        # Counting everything again (episodes included): the first time, or when something the
        # counts hold changed since (a task's turns or category, a counted battle, vote or reply
        # edited in the admin). Counts stored by another version are counted again below.
        recount = recount or previous is None or not _followable(state, previous)
        newly_ended = _take_ended_battles()
        # A battle's episodes are recorded once, when it ends (nothing it holds changes after).
        votes_services.record_fix_episodes(battle_ids=None if recount else newly_ended)
        counted = Battle.objects.filter(tallied=True) if recount else Battle.objects.filter(pk__in=newly_ended)
        last_ended = counted.aggregate(last=Max("ended"))["last"]
        episodes_through = last_ended or (previous.episodes_through if previous else None)
    with stopwatch("vote counts"):
        stored = None if recount else selectors.stored_tally()
        counts = (
            selectors.battles_tally(Q(battle__tallied=True), selectors.flagged_voters())
            if stored is None
            else stored.plus(selectors.battles_tally(Q(battle_id__in=newly_ended), stored.flagged))
        )
        counts = _reflagged(counts)  # Flags set or cleared in the admin since.
    with stopwatch("anomaly detection"):
        detector_table = counts.detector_table()
        flag_anomalous_voters(detector_table)
        flag_anomalous_networks(selectors.network_detector_table())
        flag_voters_of_flagged_networks(detector_table)
    with stopwatch("vote counts"):
        counts = _reflagged(counts)
        _store_tally(counts)
    rounds = settings.LEADERBOARD_BOOTSTRAP_ROUNDS if rounds is None else rounds
    names = selectors.roster_names()
    last_vote = Vote.objects.aggregate(last=Max("pk"))["last"] or 0
    earlier = {s.category: s for s in previous.snapshots.all()} if previous else {}
    refresh = LeaderboardRefresh.objects.create(last_vote_id=last_vote, episodes_through=episodes_through)
    with stopwatch("fix rates"):
        fixes = selectors.fix_rates(names, counts)
    provisional_below = settings.LEADERBOARD_PROVISIONAL_VOTES
    with stopwatch("votes to pair counts"):
        tallied = selectors.vote_tally(names, counts)  # Every board, and what each leaves out.
    with stopwatch("online Elo"):
        # Online Elo goes on from the previous refresh with the votes of the battles ended since.
        # (A recount starts it again from every vote too.)
        new_games = {} if recount else selectors.elo_games(Q(battle_id__in=newly_ended), names, counts.flagged)
        all_games: dict[str, selectors.EloGames] | None = None
    for position, (category, title) in enumerate(selectors.categories()):
        if category in selectors.EPISODE_CATEGORIES:
            with stopwatch("fix-ability"):
                _fixing_snapshot(refresh, position, category, title, provisional_below, counts)
            continue
        before = earlier.get(category)
        with stopwatch("votes to pair counts"):
            data = selectors.category_data(
                category, names, tallied.boards.get(category, selectors.BoardCounts({}, {}, 0))
            )
        with stopwatch("online Elo"):
            games = new_games.get(category, selectors.EloGames([]))
            if recount or before is None or before.elo_votes != round(data.outcomes.total) - len(games.games):
                # No Elo to go on from, or votes were excluded (a flagged voter, a leak) or let
                # back in since: online Elo cannot take a vote back, so it starts again from all.
                if all_games is None:
                    all_games = selectors.elo_games(Q(battle__tallied=True), names, counts.flagged)
                before, games = None, all_games.get(category, selectors.EloGames([]))
            elif not games.games:
                games.through = (before.elo_through_ended, before.elo_through_vote)
            start = np.array([(before.elo_state if before else {}).get(name, ratings.BASE_RATING) for name in names])
            elo = ratings.online_elo(len(names), games.games, k=settings.LEADERBOARD_ELO_K, start=start)
        with stopwatch("ratings and intervals"):
            rows = board.compute_board(
                names,
                data.outcomes,
                elo=elo,
                ci=board.CLUSTERED,
                voters=data.voters,
                rounds=rounds,
                seed=seed,
                pair_weights=data.pair_weights,
            )
        # Style control for the overall board: a toggle on the page, with its coefficients.
        with stopwatch("style control"):
            style_rows, style_coefficients = (
                board.compute_style_board(
                    names, selectors.style_outcomes(names, counts), voters=selectors.style_voters(names, counts)
                )
                if category == selectors.OVERALL
                else ([], {})
            )
        # The matrices cover the rated models only, in rank order, as the table lists them.
        rated = [row.model for row in rows]
        index = [names.index(name) for name in rated]
        played = data.outcomes.restricted(np.isin(np.arange(len(names)), index))
        order = np.argsort(np.argsort(index))  # Positions of the rated models in name order.
        fractions = ratings.win_fraction_matrix(played)[np.ix_(order, order)]
        met = played.games()[np.ix_(order, order)]
        LeaderboardSnapshot.objects.create(
            refresh=refresh,
            position=position,
            category=category,
            title=title,
            votes=round(data.outcomes.total),
            method=ratings.CLUSTERED,
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
            excluded=tallied.excluded(category),
            model_names=rated,
            win_fractions=[[None if math.isnan(v) else round(float(v), 4) for v in line] for line in fractions],
            battle_counts=met.astype(int).tolist(),
            elo_state={name: float(value) for name, value in zip(names, elo, strict=True)},
            elo_through_ended=games.through[0],
            elo_through_vote=games.through[1],
            elo_votes=round(data.outcomes.total),
            style_rows=[{**row.as_dict(), "provisional": row.votes < provisional_below} for row in style_rows],
            style_coefficients=style_coefficients,
        )
    refresh.seconds = time.perf_counter() - started
    refresh.stages = {stage: round(seconds, 4) for stage, seconds in stopwatch.seconds.items()}
    refresh.save(update_fields=["seconds", "stages"])

    def record() -> None:  # Once committed: a refresh rolled back is no refresh.
        REFRESH_SECONDS.observe(refresh.seconds)
        for stage, seconds in stopwatch.seconds.items():
            REFRESH_STAGE_SECONDS.labels(stage=stage).observe(seconds)

    transaction.on_commit(record)
    return refresh


def _fixing_snapshot(
    refresh: LeaderboardRefresh,
    position: int,
    category: str,
    title: str,
    provisional_below: int,
    counts: tally.Tally,
) -> LeaderboardSnapshot:
    """The "Fixing mistakes" board: fix-ability from the counted fix episodes (leaderboard.fixing),
    beside each model's rate of judged first tries judged wrong (where its episodes start)."""
    episodes = selectors.fix_episode_counts(counts)
    rows = fixing.rate_fixes(episodes)
    wrong = selectors.wrong_rates([row.model for row in rows], counts)
    return LeaderboardSnapshot.objects.create(
        refresh=refresh,
        position=position,
        category=category,
        title=title,
        votes=round(episodes.count.sum()),
        method="fix-ability",
        rows=[
            {
                **row.as_dict(),
                "provisional": row.episodes < provisional_below,
                "wrong_rate": _wrong_rate(wrong[row.model]),
            }
            for row in rows
        ],
        unrated=[name for name in selectors.roster_names() if name not in {row.model for row in rows}],
        excluded=selectors.excluded_episodes(counts),
    )


def _locked_tally_state() -> VoteTallyState:
    """The running counts' row (without its data), locked until the refresh commits: two
    refreshes at once take turns, and a change that makes the counts stale
    (``mark_tally_stale``) waits for it."""
    state = VoteTallyState.objects.select_for_update().defer("data").filter(pk=1).first()
    return state if state is not None else VoteTallyState.objects.create(pk=1, data=b"", stale=True)


def _store_tally(counts: tally.Tally) -> None:
    """Keep the counts for the next refresh (in PostgreSQL's binary format, as
    ``selectors.stored_tally`` reads them)."""
    data = counts.to_bytes()
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as cursor:
            table = VoteTallyState._meta.db_table
            cursor.execute(f"UPDATE {table} SET data = %b, stale = false, updated = now() WHERE id = 1", [data])
    else:
        VoteTallyState.objects.filter(pk=1).update(data=data, stale=False, updated=timezone.now())


def _take_ended_battles() -> list[int]:
    """The ended battles whose votes are not counted yet, marked counted (by this refresh): one
    statement, so that a battle ending meanwhile is either marked and returned or left for the
    next refresh."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Battle._meta.db_table} SET tallied = %s WHERE state = %s AND NOT tallied RETURNING id",
            [True, Battle.State.ENDED],
        )
        return [pk for (pk,) in cursor.fetchall()]


def _followable(state: VoteTallyState, previous: LeaderboardRefresh) -> bool:
    """Whether the previous refresh's counts can be followed: not stale, and no task changed
    since (its correction turns decide the fix episodes, and so which after-fix votes count;
    its category, where votes count). Counts stored by another version are not read either
    (``tally.Tally.from_bytes``)."""
    return not state.stale and not Task.objects.filter(updated__gte=previous.created).exists()


def _reflagged(counts: tally.Tally) -> tally.Tally:
    """The counts as the flags are now: the voters flagged or cleared since have their votes
    taken out as the old flags counted them and put back as the new ones do."""
    flagged = selectors.flagged_voters()
    changed = flagged ^ counts.flagged
    if not changed:
        return counts
    theirs = Q(battle__tallied=True, battle__voter_key__in=changed)
    return counts.reflagged(
        flagged, selectors.battles_tally(theirs, counts.flagged), selectors.battles_tally(theirs, flagged)
    )


def mark_tally_stale() -> None:
    """A counted battle or vote changed (in the admin): the next refresh counts every vote again."""
    VoteTallyState.objects.update(stale=True)


def flag_anomalous_voters(table: anomaly.VoteTable) -> list[FlaggedVoter]:
    """Flag the voters whose votes are anomalous (leaderboard.anomaly) in ``table``, the votes
    of ended battles by voters not flagged yet; a flag an admin cleared is never set again."""
    found = anomaly.suspicious_voters(
        table,
        alpha=settings.LEADERBOARD_ANOMALY_ALPHA,
        min_votes=settings.LEADERBOARD_ANOMALY_MIN_VOTES,
        false_alarms=settings.LEADERBOARD_ANOMALY_FALSE_ALARMS,
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


def flag_anomalous_networks(table: anomaly.VoteTable) -> list[FlaggedNetwork]:
    """Flag the client networks whose votes, taken together, are anomalous: the voters' tests
    (leaderboard.anomaly) on ``table``, the votes grouped by network instead of by voter key
    (``selectors.network_detector_table``). A campaign that starts each battle in a fresh
    session has one vote per voter key, below any test's minimum, but all of them on a network
    or two. A flag an admin cleared is never set again."""
    found = anomaly.suspicious_voters(
        table,
        alpha=settings.LEADERBOARD_ANOMALY_ALPHA,
        min_votes=settings.LEADERBOARD_ANOMALY_MIN_VOTES,
    )
    keys = [a.voter for a in found]
    known = set(FlaggedNetwork.objects.filter(network_key__in=keys).values_list("network_key", flat=True))
    flags = [
        FlaggedNetwork(
            network_key=a.voter,
            reason=f"network: {a.reason()}",
            source=FlagSource.AUTOMATIC,
            p_value=a.p_value,
        )
        for a in found
        if a.voter not in known
    ]
    return FlaggedNetwork.objects.bulk_create(flags, ignore_conflicts=True)


def flag_voters_of_flagged_networks(table: anomaly.VoteTable) -> list[FlaggedVoter]:
    """Flag the voter keys behind a flagged network (not cleared) whose votes there are the
    campaign's (``anomaly.campaign_voters``: more than half of their decisive votes from it chose
    the model the network's votes concentrate on, against the shares in ``table``, the voters'
    detector table), pointing at the network's flag: every read of the board and of the
    research data then leaves those votes out as it does a flagged voter's, and the fresh
    sessions a flagged network opens later are flagged at the next refresh. The other voters
    behind it (an office, a carrier's NAT) keep their votes: a flag that pointed at the network
    for a voter it no longer catches (every voter behind a flagged network was flagged once) is
    removed. A voter flag of its own, or one an admin cleared, is left as it is."""
    networks = {flag.network_key: flag for flag in FlaggedNetwork.objects.filter(cleared=False)}
    if not networks:
        return []
    caught = anomaly.campaign_voters(selectors.network_voter_rows(list(networks)), table)
    FlaggedVoter.objects.filter(network__in=list(networks.values()), cleared=False).exclude(
        voter_key__in=list(caught)
    ).delete()
    known = set(FlaggedVoter.objects.filter(voter_key__in=list(caught)).values_list("voter_key", flat=True))
    flags = [
        FlaggedVoter(
            voter_key=voter_key,
            network=networks[network_key],
            reason=f"voted for its target from a flagged {networks[network_key].reason}"[:300],
            source=networks[network_key].source,
            p_value=networks[network_key].p_value,
        )
        for voter_key, network_key in caught.items()
        if voter_key not in known
    ]
    return FlaggedVoter.objects.bulk_create(flags, ignore_conflicts=True)


def _wrong_rate(rate: ratings.FixRate) -> dict[str, float | int | None]:
    """Judged replies judged wrong: ``wrong`` of ``judged``, the share and its Wilson interval."""
    shares = _fix_rate(rate)
    return {"wrong": rate.fixed, "judged": rate.corrections, **{key: shares[key] for key in ("rate", "lower", "upper")}}


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
    LEADERBOARD_REFRESH_VOTES votes have arrived since (beat calls this every minute).

    First the battles left idle after a vote are ended (votes.services.end_idle_battles): their
    votes count as new here, though cast before the latest refresh."""
    idle = votes_services.end_idle_battles()
    latest = selectors.latest_refresh()
    if latest is not None:
        age = (timezone.now() - latest.created).total_seconds()
        new_votes = selectors.new_votes_since(latest) + idle.votes
        if new_votes == 0 or (
            age < settings.LEADERBOARD_REFRESH_SECONDS and new_votes < settings.LEADERBOARD_REFRESH_VOTES
        ):
            return None
    return refresh_leaderboard()
