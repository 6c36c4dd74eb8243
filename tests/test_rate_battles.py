"""manage.py rate_battles: a public arena's clean_battle dump, rated with this arena's statistics."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

BATTLES = [
    {"model_a": "alpha", "model_b": "beta", "winner": "model_a", "tstamp": 3},
    {"model_a": "beta", "model_b": "alpha", "winner": "model_b", "tstamp": 1},
    {"model_a": "alpha", "model_b": "gamma", "winner": "model_a", "tstamp": 2},
    {"model_a": "gamma", "model_b": "beta", "winner": "tie", "tstamp": 4},
    {"model_a": "beta", "model_b": "gamma", "winner": "tie (bothbad)", "tstamp": 5},
    {"model_a": "gamma", "model_b": "alpha", "winner": "model_a", "tstamp": 6},
] * 20


def rate(path: Path, *args: str) -> str:
    out = StringIO()
    call_command("rate_battles", str(path), *args, stdout=out)
    return out.getvalue()


def test_json_list_and_json_lines_give_the_same_board(tmp_path: Path) -> None:
    listed = tmp_path / "battles.json"
    listed.write_text(json.dumps(BATTLES))
    lines = tmp_path / "battles.jsonl"
    lines.write_text("\n".join(json.dumps(b) for b in BATTLES) + "\n")
    board = json.loads(rate(listed, "--json", "--rounds=200", "--seed=7"))
    assert json.loads(rate(lines, "--json", "--rounds=200", "--seed=7")) == board
    assert [row["model"] for row in board] == ["alpha", "gamma", "beta"]
    assert set(board[0]) == {
        "model",
        "rating",
        "lower",
        "upper",
        "rank",
        "votes",
        "elo",
        "group",  # Comparison group, and open-ended intervals (issue 38 point 5).
        "lower_open",
        "upper_open",
        "bound_note",
        "swap_votes",  # Rank fragility (issue 38 point 6).
    }
    # Each row but the last: the votes whose removal swaps it with the next (leaderboard.fragility).
    assert all(row["swap_votes"] > 0 for row in board[:-1]) and board[-1]["swap_votes"] is None
    assert all(row["lower"] <= row["rating"] <= row["upper"] for row in board)
    assert [row["votes"] for row in board] == [80, 80, 80]
    assert board[0]["rank"] == 1
    # The seed is honoured; another seed moves the bootstrap bounds a little, not the ratings.
    other = json.loads(rate(listed, "--json", "--rounds=200", "--seed=8"))
    assert [row["rating"] for row in other] == [row["rating"] for row in board]
    sandwich = json.loads(rate(listed, "--json", "--ci=sandwich"))
    assert [row["rating"] for row in sandwich] == [row["rating"] for row in board]
    table = rate(listed, "--rounds=50")
    assert "alpha" in table.splitlines()[2] and "95% bootstrap intervals" in table


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "No battles"),
        ("[{]", "Not valid JSON"),
        ('{"model_a": "x"}\n{oops}', "Line 2 is not valid JSON"),
        ('[{"model_a": "x", "model_b": "y", "winner": "draw"}]', "Battle 1 has winner 'draw'"),
        ('[{"model_a": "x", "model_b": "x", "winner": "tie"}]', "against itself"),
        ('[{"model_b": "y", "winner": "tie"}]', "needs model_a and model_b"),
        ('[{"model_a": "x", "model_b": "y", "winner": "tie", "tstamp": "noon"}]', "tstamp"),
        ("[1]", "Battle 1 is not an object"),
    ],
)
def test_bad_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "battles.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        rate(path)


def test_missing_file_and_bad_rounds(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="Cannot read"):
        rate(tmp_path / "nope.json")
    path = tmp_path / "battles.json"
    path.write_text(json.dumps(BATTLES))
    with pytest.raises(CommandError, match="--rounds must be at least 1"):
        rate(path, "--rounds=0")
