"""bench_leaderboard runs every stage and reports what it claims (tiny sizes: not a timing test)."""

import json
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from leaderboard import bench, bench_database, busy, ratings, style


def test_reduction_matches_the_vote_by_vote_count() -> None:
    a, b, score = bench.synthetic_votes(3000, 6, seed=1)
    reduced = bench.reduce_to_outcomes(6, a, b, score)
    direct = ratings.PairOutcomes.from_games(6, zip(a.tolist(), b.tolist(), score.tolist(), strict=True))
    np.testing.assert_array_equal(reduced.wins(), direct.wins())
    assert reduced.total == 3000


def test_bench_command_json() -> None:
    out = StringIO()
    call_command(
        "bench_leaderboard",
        "--votes=5000",
        "--models=6",
        "--rounds=50",
        "--reference-rounds=1",
        "--repeats=3",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    stages = [stage["stage"] for stage in result["stages"]]
    assert stages[0] == "reduce votes to pair counts, one pass (7 vote boards)"
    # The vote boards' intervals are clustered by voter, as the refresh computes them.
    assert "intervals clustered by voter, groups and open ends (7 boards)" in stages
    assert "votes by voter, per board (200,000 voters)" in stages
    assert any(stage.startswith("fix-ability (500 episodes)") for stage in stages)
    assert any(stage.startswith("anomaly detection (20,000 voters") for stage in stages)
    assert any(stage.startswith("style control: fit and intervals") for stage in stages)
    assert "rank fragility (7 boards)" in stages
    assert result["busy"] is None and result["cpus"] >= 1 and len(result["load_average"]) == 3
    # The synthetic stuffers are found, and no honest voter.
    assert result["stuffers_flagged"] >= 20 and result["honest_flagged"] == 0
    # The whole refresh is timed three times: each repeat's total is the sum of its stages, the
    # figure quoted their median; a stage's median lies between its fastest and slowest repeats.
    each = result["seconds_total_each_repeat"]
    assert result["repeats"] == 3 and len(each) == 3
    assert result["seconds_total"] == pytest.approx(float(np.median(each)))
    assert sum(stage["fastest_seconds"] for stage in result["stages"]) <= min(each) + 1e-9
    assert sum(stage["slowest_seconds"] for stage in result["stages"]) >= max(each) - 1e-9
    assert all(s["fastest_seconds"] <= s["seconds"] <= s["slowest_seconds"] for s in result["stages"])
    reference = result["reference"]
    assert reference["rounds_run"] == 1
    assert reference["seconds_extrapolated"] == pytest.approx(reference["seconds_per_round"] * 50)
    assert result["speedup_vs_reference"] == pytest.approx(reference["seconds_extrapolated"] / result["seconds_total"])
    styled = result["style_reference"]
    assert styled["battles"] == 5000 and styled["rounds_run"] == 50 and styled["reference_rounds_run"] == 1
    assert styled["speedup_per_round"] == pytest.approx(
        styled["reference_seconds_per_round"] / styled["seconds_per_round"]
    )
    table = StringIO()
    call_command("bench_leaderboard", "--votes=2000", "--models=4", "--rounds=20", "--reference-rounds=0", stdout=table)
    assert "whole refresh" in table.getvalue() and "not run" in table.getvalue()
    assert "run 5 times" in table.getvalue()
    with pytest.raises(CommandError):
        call_command("bench_leaderboard", "--models=1")
    with pytest.raises(CommandError, match="--repeats"):
        call_command("bench_leaderboard", "--repeats=0")
    with pytest.raises(CommandError, match="--busy"):
        call_command("bench_leaderboard", "--busy=-1")


def test_busy_processes_spin_through_the_repeats_timed_again() -> None:
    """--busy N: the repeats are timed again while N processes spin, started before and ended
    after; both figures are reported, and the spinners did use the CPU (not a timing test)."""
    out = StringIO()
    call_command(
        "bench_leaderboard",
        "--votes=3000",
        "--models=5",
        "--rounds=20",
        "--reference-rounds=0",
        "--repeats=2",
        "--busy=1",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    loaded = result["busy"]
    assert loaded["processes"] == 1 and len(loaded["seconds_total_each_repeat"]) == 2
    assert [stage["stage"] for stage in loaded["stages"]] == [stage["stage"] for stage in result["stages"]]
    assert loaded["seconds_total"] == pytest.approx(float(np.median(loaded["seconds_total_each_repeat"])))
    (spun,) = loaded["spinner_cpu_seconds"]
    assert spun is None or spun > 0
    table = StringIO()
    call_command(
        "bench_leaderboard",
        "--votes=2000",
        "--models=4",
        "--rounds=10",
        "--reference-rounds=0",
        "--repeats=1",
        "--busy=2",
        stdout=table,
    )
    text = table.getvalue()
    assert "then 1 more with 2 busy processes" in text and "whole refresh, 2 busy processes" in text
    assert "load average" in text


def test_spinners_are_ended_with_the_block() -> None:
    with busy.busy_cores(2) as spinners:
        assert len(spinners.pids) == 2
        assert all(Path(f"/proc/{pid}").exists() for pid in spinners.pids)
    assert all(cpu is not None and cpu >= 0 for cpu in spinners.cpu_seconds)
    assert not any(Path(f"/proc/{pid}").exists() for pid in spinners.pids)


@pytest.mark.django_db(transaction=True)
def test_bench_from_a_scratch_database() -> None:
    """--from-database stores the votes in a database of its own, times the site's refresh stage
    by stage (the first, then the next ones, each after more battles ended), and drops that
    database: nothing is left in the test database."""
    from django.db import connection

    from votes.models import Battle

    out = StringIO()
    call_command(
        "bench_leaderboard", "--from-database", "--votes=700", "--models=5", "--rounds=10", "--json", stdout=out
    )
    result = json.loads(out.getvalue())
    assert result["rows"]["votes_battle"] == 700
    assert result["rows"]["votes_vote"] > 700  # a second vote after each correction
    first, *following = result["refreshes"]
    assert {"anomaly detection", "fix episodes", "votes to pair counts", "style control"} <= set(first["stages"])
    assert sum(first["stages"].values()) <= first["seconds"]
    assert len(following) == bench_database.NEXT_REFRESHES
    assert all(set(refresh["stages"]) == set(first["stages"]) for refresh in following)
    assert not Battle.objects.exists()  # back on the test database, untouched
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [result["database"]])
        assert cursor.fetchone() is None


def test_one_pass_reduction_gives_each_board_its_own_votes() -> None:
    a, b, score = bench.synthetic_votes(4000, 6, seed=2)
    group, boards = bench.synthetic_categories(4000, seed=2)
    reduced = bench.reduce_to_boards(6, a, b, score, group, [groups for _, groups in boards])
    for (_, groups), outcomes in zip(boards, reduced, strict=True):
        mask = groups[group]
        alone = bench.reduce_to_outcomes(6, a[mask], b[mask], score[mask])
        np.testing.assert_array_equal(outcomes.wins(), alone.wins())
        assert outcomes.total == mask.sum()


@pytest.mark.django_db(transaction=True)
def test_synthetic_votes_store_the_style_casting_them_would() -> None:
    """The scratch database's votes carry the style the site's write path computes from their
    battles' messages (votes.services.record_seen_style)."""
    from leaderboard import bench_database
    from votes import services as vote_services
    from votes.models import Vote

    bench_database.populate(300, 4, seed=5)
    columns = [f"seen_{feature}_{side}" for side in "ab" for feature in style.FEATURES]
    stored = list(Vote.objects.order_by("pk").values_list(*columns))
    assert any(row[0] != row[4] for row in stored)  # Not all zeros or alike.
    vote_services.record_seen_style(Vote.objects.all())
    assert list(Vote.objects.order_by("pk").values_list(*columns)) == stored
