"""bench_leaderboard runs every stage and reports what it claims (tiny sizes: not a timing test)."""

import json
from io import StringIO

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from leaderboard import bench, ratings


def test_reduction_matches_the_vote_by_vote_count() -> None:
    a, b, score = bench.synthetic_votes(3000, 6, seed=1)
    reduced = bench.reduce_to_outcomes(6, a, b, score)
    direct = ratings.PairOutcomes.from_games(6, zip(a.tolist(), b.tolist(), score.tolist(), strict=True))
    np.testing.assert_array_equal(reduced.wins(), direct.wins())
    assert reduced.total == 3000


def test_bench_command_json() -> None:
    out = StringIO()
    call_command(
        "bench_leaderboard", "--votes=5000", "--models=6", "--rounds=50", "--reference-rounds=1", "--json", stdout=out
    )
    result = json.loads(out.getvalue())
    stages = [stage["stage"] for stage in result["stages"]]
    assert stages[0] == "reduce votes to pair counts" and "bootstrap intervals (50 rounds)" in stages
    assert result["seconds_total"] == pytest.approx(sum(stage["seconds"] for stage in result["stages"]))
    reference = result["reference"]
    assert reference["rounds_run"] == 1
    assert reference["seconds_extrapolated"] == pytest.approx(reference["seconds_per_round"] * 50)
    assert result["speedup_vs_reference"] == pytest.approx(reference["seconds_extrapolated"] / result["seconds_total"])
    table = StringIO()
    call_command("bench_leaderboard", "--votes=2000", "--models=4", "--rounds=20", "--reference-rounds=0", stdout=table)
    assert "whole refresh" in table.getvalue() and "not run" in table.getvalue()
    with pytest.raises(CommandError):
        call_command("bench_leaderboard", "--models=1")
