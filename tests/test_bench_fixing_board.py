"""manage.py bench_fixing_board, small: voters who judge as the seed task's checker does play it
against the fixer and its base through the real websocket, rating, voting and correcting the
wrong side alone; the live "Fixing mistakes" board the leaderboard refresh then computes puts the
fixer above its base, intervals apart."""

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from inference.models import LLM
from leaderboard.management.commands.bench_fixing_board import above, parse_expectation, separated
from tests.conftest import registered_llm
from votes import checkers, evaluation, services
from votes.models import Battle
from votes.testing.checker_voter import ScriptedTurn, correction_text, vote_choice

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = Path(__file__).resolve().parent.parent / "votes" / "fixtures" / "tasks.json"
BATTLES = 10


def test_checker_voters_put_the_fixer_above_its_base_on_the_live_board(
    smollm2_preset: Path, fixer_preset: Path, run_id: str, tmp_path: Path, capsys: Any
) -> None:
    services.import_tasks(json.loads(TASKS.read_text()))
    # Queues only the bench's worker serves; a call takes about 35 tokens, chatter is cut at 48.
    base, fixer = (
        registered_llm(path, f"fixbench-{run_id}.{path.name}", max_new_tokens=48).name
        for path in (smollm2_preset, fixer_preset)
    )
    report_path = tmp_path / "board.json"

    call_command(
        "bench_fixing_board",
        battles=BATTLES,
        at_once=BATTLES,  # All at once: the engine batches their replies.
        turns=2,  # The first request and the scripted correction of its year.
        feedback="checker",  # The checker's reason: the kind both models fix most often.
        expect=[f"{fixer}>{base}"],
        json=report_path,
        log_dir=tmp_path / "logs",
    )

    report = json.loads(report_path.read_text())
    assert report["errors"] == [] and report["finished"] == report["battles_ended"] == BATTLES
    assert [fixer, base] in report["separated"]
    board = {row["model"]: row for row in report["board"]}
    assert above(board[fixer], board[base])
    # The server's checker judged every reply as the voters did, and recorded an episode for each
    # of their corrections of a wrong reply (to one side, after a reply the checker judged wrong)
    # and each scripted year correction of a wrong first reply; the board counts them all but
    # those of battles left out (a reply that names a model: SmolLM2 sometimes says who made it).
    assert report["judged_as_the_server"] == report["replies_judged"] > 0
    counted = sum(row["episodes"] for row in report["board"])
    assert counted + sum(report["excluded"].values()) == report["episodes_recorded"] >= report["corrections"] > 0
    assert report["votes"] >= BATTLES  # A first-try vote in every battle, after-fix ones where corrected.
    assert "separated (intervals apart):" in capsys.readouterr().out
    # It played in a database of its own, dropped afterwards.
    assert not Battle.objects.exists()


def test_the_bench_refuses_what_it_cannot_run(demo_llms: list[LLM]) -> None:
    Battle.objects.create(model_a=demo_llms[0], model_b=demo_llms[1])
    with pytest.raises(CommandError, match="--in-place needs a database without battles"):
        call_command("bench_fixing_board", in_place=True)
    with pytest.raises(CommandError, match="No active task"):
        call_command("bench_fixing_board", task="nothing")
    services.import_tasks(json.loads(TASKS.read_text()))
    with pytest.raises(CommandError, match="BETTER>WORSE"):
        call_command("bench_fixing_board", expect=["just-one"])
    with pytest.raises(CommandError, match="--feedback takes"):
        call_command("bench_fixing_board", feedback="rude")
    with pytest.raises(CommandError, match="'nobody' is not a model anonymous battles draw"):
        call_command("bench_fixing_board", expect=["nobody>tiny-gemma"])


def test_the_voter_judges_corrects_and_votes_as_the_checker_says() -> None:
    turn = ScriptedTurn.from_script(json.loads(TASKS.read_text())["tasks"][0]["turns"][1])
    wrong = turn.check('action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)')
    right = turn.check('action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)')
    assert isinstance(wrong, checkers.CheckResult) and right is not None
    assert (wrong.verdict, right.verdict) == ("mistake", "correct")
    assert correction_text(wrong, evaluation.CHECKER_FEEDBACK) == evaluation.correction_for(wrong)
    assert "2024" in correction_text(wrong, evaluation.CHECKER_FEEDBACK)
    assert correction_text(wrong, evaluation.HUMAN_FEEDBACK) == "Fix the year in the API call."
    assert correction_text(wrong, evaluation.GENERIC_FEEDBACK) == evaluation.GENERIC_CORRECTION
    assert [vote_choice({"a": a, "b": b}) for a, b in ((False, True), (True, False), (False, False), (True, True))] == [
        "a",
        "b",
        "tie",
        "both_bad",
    ]


def test_separation_needs_closed_bounds_apart() -> None:
    rows = [
        {"model": "fixer", "lower": 900.0, "upper": 1100.0},
        {"model": "base", "lower": None, "upper": 600.0},  # No fix observed: open below.
        {"model": "middle", "lower": 650.0, "upper": 950.0},
        {"model": "unbounded", "lower": 700.0, "upper": None},  # No failure observed: open above.
    ]
    assert separated(rows) == [["fixer", "base"], ["middle", "base"], ["unbounded", "base"]]
    assert not above(rows[0], rows[3]) and not above(rows[0], None)
    assert parse_expectation(" fixer > base ") == ("fixer", "base")
