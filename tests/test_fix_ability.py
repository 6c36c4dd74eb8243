"""The fix-ability rating (leaderboard/fixing.py), checked by simulation against known truths."""

import json
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from leaderboard.fixing import Episode, EpisodeCounts, episodes_from_records, rate_fixes

TASK_TURNS = [(task, turn) for task in ("calendar", "dates", "units") for turn in (1, 2, 3)]


def simulate(
    abilities: np.ndarray,
    episodes: int,
    rng: np.random.Generator,
    *,
    difficulties: np.ndarray | None = None,
    easy_for: int | None = None,
    per_battle: int = 2,
) -> list[Episode]:
    """``episodes`` fix episodes over the models (log-odds ``abilities``) and the task turns
    (log-odds ``difficulties``), ``per_battle`` to a battle. ``easy_for``: that model gets the
    easiest task turn three times out of four (the confounding the regression removes)."""
    if difficulties is None:
        difficulties = np.linspace(1.5, -1.5, len(TASK_TURNS))
    out = []
    for k in range(episodes):
        model = int(rng.integers(len(abilities)))
        cell = int(rng.integers(len(TASK_TURNS)))
        if model == easy_for and rng.random() < 0.75:
            cell = 0
        p = 1.0 / (1.0 + np.exp(-(abilities[model] + difficulties[cell])))
        task, turn = TASK_TURNS[cell]
        out.append(Episode(f"m{model}", task, turn, bool(rng.random() < p), battle=f"b{k // per_battle}"))
    return out


def logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def test_counted_episodes_rate_as_the_episodes_listed_one_by_one() -> None:
    """The site rates episodes counted per (model, task turn, fixed, cluster), a battle's own
    cluster only where it has more than one (leaderboard.tally): the same ratings, intervals and
    rates as the episodes one by one, clustered by battle."""
    rng = np.random.default_rng(8)
    episodes = simulate(np.array([0.5, 0.0, -0.5, 1.0]), 3_000, rng, per_battle=1)
    episodes += simulate(np.array([0.5, 0.0, -0.5, 1.0]), 600, rng, per_battle=3)
    episodes = [Episode(e.model, e.task, e.turn, e.fixed, f"{e.battle}-{k < 3_000}") for k, e in enumerate(episodes)]
    listed = EpisodeCounts.from_episodes(episodes)
    sizes: dict[str | None, int] = {}
    for e in episodes:
        sizes[e.battle] = sizes.get(e.battle, 0) + 1
    keys = [(e.model, e.task, e.turn, e.fixed, e.battle if sizes[e.battle] > 1 else None) for e in episodes]
    unique = sorted(set(keys), key=str)
    counted = EpisodeCounts(
        models=listed.models,
        cells=listed.cells,
        model=np.array([listed.models.index(key[0]) for key in unique]),
        cell=np.array([listed.cells.index((key[1], key[2])) for key in unique]),
        fixed=np.array([float(key[3]) for key in unique]),
        count=np.array([float(keys.count(key)) for key in unique]),
        cluster=np.array([-1 if key[4] is None else sorted(sizes).index(key[4]) for key in unique]),
    )
    assert len(unique) < len(episodes) / 4
    assert rate_fixes(counted) == rate_fixes(episodes)


def test_a_model_that_never_fixes_never_ranks_above_one_that_fixes_sixty_percent() -> None:
    """Even when the non-fixer's corrections are the easy ones (its raw rate is then not 0)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        abilities = np.array([-9.0, logit(0.6), 0.0, -1.0, 1.0, -0.5, 0.5, 1.5])
        rows = {row.model: row for row in rate_fixes(simulate(abilities, 2000, rng, easy_for=0))}
        assert rows["m0"].rating < rows["m1"].rating and rows["m0"].rank > rows["m1"].rank, seed


def test_difficulty_is_controlled_for() -> None:
    """Two equal models, one corrected mostly on the easiest turn: its raw fix rate is far
    higher, its rating is not."""
    rng = np.random.default_rng(40)
    rows = {row.model: row for row in rate_fixes(simulate(np.zeros(2), 4000, rng, easy_for=0))}
    assert rows["m0"].fix_rate - rows["m1"].fix_rate > 0.2
    assert rows["m0"].lower <= rows["m1"].rating <= rows["m0"].upper
    assert abs(rows["m0"].rating - rows["m1"].rating) < 40


def test_intervals_cover_the_true_abilities_at_the_nominal_rate() -> None:
    """95% intervals of the abilities (contrasts with their mean, Elo scale) hold the truth in
    93-97% of 1600 checks: 200 arenas of 2000 episodes over 8 models, two to a battle."""
    abilities = np.linspace(-1.5, 1.5, 8)
    truth = 1000.0 + 400.0 / np.log(10.0) * (abilities - abilities.mean())
    covered = checks = 0
    for seed in range(200):
        rows = rate_fixes(simulate(abilities, 2000, np.random.default_rng(100 + seed)))
        by_model = {row.model: row for row in rows}
        for i, true in enumerate(truth):
            row = by_model[f"m{i}"]
            covered += row.lower <= true <= row.upper
            checks += 1
    assert 0.93 <= covered / checks <= 0.97, covered / checks


def test_ranking_agrees_with_the_true_abilities() -> None:
    abilities = np.array([logit(p) for p in (0.05, 0.15, 0.3, 0.45, 0.55, 0.7, 0.85, 0.95)])
    for seed in range(10):
        rows = rate_fixes(simulate(abilities, 2000, np.random.default_rng(300 + seed)))
        fitted = np.array([next(r.rating for r in rows if r.model == f"m{i}") for i in range(8)])
        assert spearman(fitted, abilities) >= 0.95, seed


def test_raw_rate_counts_and_wilson_interval_beside_the_rating() -> None:
    episodes = [Episode("a", "t", 1, fixed) for fixed in (True, True, True, False)]
    episodes += [Episode("b", "t", 1, fixed) for fixed in (True, False, False, False)]
    rows = {row.model: row for row in rate_fixes(episodes)}
    assert (rows["a"].episodes, rows["a"].fixed, rows["a"].fix_rate) == (4, 3, 0.75)
    assert rows["a"].fix_lower < 0.75 < rows["a"].fix_upper
    assert rows["a"].rating > 1000 > rows["b"].rating
    assert rows["a"].rating + rows["b"].rating == pytest.approx(2000, abs=0.2)
    assert rate_fixes([]) == []


def test_records_are_validated_and_decoys_left_out() -> None:
    records = [
        {"model": "a", "task": "t", "turn": 1, "fixed": True, "battle": 7},
        {"model": "a", "task": "t", "turn": 1, "fixed": False, "decoy": True, "feedback_kind": "generic"},
    ]
    assert episodes_from_records(records) == [Episode("a", "t", 1, True, "7")]
    for bad, message in (
        ([1], "Episode 1 is not an object."),
        ([{"task": "t", "turn": 1, "fixed": True}], "Episode 1 needs a model name."),
        ([{"model": "a", "turn": 1, "fixed": True}], "Episode 1 needs a task name."),
        ([{"model": "a", "task": "t", "turn": -1, "fixed": True}], "needs turn, a whole number"),
        ([{"model": "a", "task": "t", "turn": 1, "fixed": "yes"}], "needs fixed, true or false."),
        ([{"model": "a", "task": "t", "turn": 1, "fixed": True, "battle": [1]}], "has a battle that is neither"),
    ):
        with pytest.raises(ValueError, match=message):
            episodes_from_records(bad)


def test_rate_fixes_command_on_json_and_json_lines(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    episodes = simulate(np.array([-1.0, 0.0, 1.0]), 600, rng)
    records = [
        {"model": e.model, "task": e.task, "turn": e.turn, "fixed": e.fixed, "battle": e.battle} for e in episodes
    ]
    as_list, as_lines = tmp_path / "episodes.json", tmp_path / "episodes.jsonl"
    as_list.write_text(json.dumps(records))
    as_lines.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    outputs = []
    for path in (as_list, as_lines):
        out = StringIO()
        call_command("rate_fixes", str(path), "--json", stdout=out)
        outputs.append(json.loads(out.getvalue()))
    assert outputs[0] == outputs[1]
    assert [row["model"] for row in outputs[0]] == ["m2", "m1", "m0"]
    assert set(outputs[0][0]) == {"model", "rating", "lower", "upper", "fix_rate", "episodes"}
    table = StringIO()
    call_command("rate_fixes", str(as_list), stdout=table)
    assert "600 fix episodes, 3 models" in table.getvalue() and "m2" in table.getvalue()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "No fix episodes in the file."),
        ("[1, 2", "Not valid JSON"),
        ('{"model": "a"}\nnot json\n', "Line 2 is not valid JSON"),
        ('[{"model": "a", "task": "t", "turn": 1}]', "Episode 1 needs fixed, true or false."),
    ],
)
def test_rate_fixes_refuses_bad_files_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("rate_fixes", str(path))
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("rate_fixes", str(tmp_path / "missing.json"))
