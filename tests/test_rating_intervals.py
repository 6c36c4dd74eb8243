"""Intervals that respect who voted, and no confidence without information (issue 38, points 4
and 5): simulations with a known truth for the voter-clustered intervals, and the boards' groups,
open-ended intervals and ranks."""

import numpy as np
import pytest

from leaderboard import board, ratings, style, wording

LOG_ODDS = np.log(10.0) / 400.0  # Rating points -> natural log-odds.
TRUE = np.linspace(-150.0, 150.0, 8)
TIES = 0.1


def population_ratings(true: np.ndarray, taste_sd: float) -> np.ndarray:
    """What the board estimates when voters differ in taste: the Bradley-Terry fit (centred) to
    the win rates of the whole population of voters (each pair's rate averaged over the tastes'
    difference, N(0, 2 sd^2), by Gauss-Hermite quadrature), pairs drawn evenly. A taste spread
    flattens the population's win rates, so this is not ``true`` itself."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    weights = weights / weights.sum()
    n = true.size
    wins = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a != b:
                gap = (true[a] - true[b] + np.sqrt(2.0) * taste_sd * nodes) * LOG_ODDS
                wins[a, b] = TIES / 2.0 + (1.0 - TIES) * (weights / (1.0 + np.exp(-gap))).sum()
    fitted = ratings.bradley_terry(wins * 1000.0, prior=0.0)
    return fitted - fitted.mean()


def arena_with_tastes(rng: np.random.Generator, taste_sd: float, voters: int = 200) -> ratings.VoterCells:
    """Votes of ``voters`` voters, each with a taste of their own for every model (normal, sd
    ``taste_sd`` rating points) and an uneven number of votes (lognormal, median 15, a few
    voters casting a hundred or more), on pairs drawn evenly; ties 10%."""
    n = TRUE.size
    taste = rng.normal(0.0, taste_sd, (voters, n))
    per_voter = np.maximum(1, rng.lognormal(np.log(15.0), 1.0, voters).round().astype(int))
    voter = np.repeat(np.arange(voters), per_voter)
    a = rng.integers(0, n, voter.size)
    b = (a + rng.integers(1, n, voter.size)) % n
    gap = (TRUE[a] + taste[voter, a] - TRUE[b] - taste[voter, b]) * LOG_ODDS
    score = (rng.random(voter.size) < 1.0 / (1.0 + np.exp(-gap))).astype(float)
    score[rng.random(voter.size) < TIES] = 0.5
    score_first = np.where(a < b, score, 1.0 - score)
    outcome = np.where(score_first == 1.0, 0, np.where(score_first == 0.0, 1, 2))
    return ratings.VoterCells(n, voter, np.minimum(a, b), np.maximum(a, b), outcome, np.ones(voter.size))


@pytest.mark.parametrize("taste_sd", [100.0, 200.0])
def test_intervals_clustered_by_voter_cover_at_the_nominal_rate_when_voters_differ_in_taste(taste_sd: float) -> None:
    """300 arenas of 200 voters (about 4,500 votes each), 8 models: the share of (arena, model)
    whose 95% interval holds the population's rating. 2,400 checks: a Monte-Carlo standard error
    of about 0.5 points, so 93-97% is the nominal 95% within about four of them. The intervals
    that take every vote as independent evidence fall short in the same arenas."""
    truth = population_ratings(TRUE, taste_sd)
    rng = np.random.default_rng(int(taste_sd))
    covered = {"clustered": 0, "independent": 0}
    arenas = 300
    for _ in range(arenas):
        votes = arena_with_tastes(rng, taste_sd)
        outcomes = votes.outcomes()
        for name, fitted in (
            ("clustered", ratings.clustered_intervals(outcomes, votes)),
            ("independent", ratings.sandwich_intervals(outcomes)),
        ):
            centre = fitted.ratings.mean()
            covered[name] += int(((fitted.lower - centre <= truth) & (truth <= fitted.upper - centre)).sum())
    share = {name: count / (arenas * TRUE.size) for name, count in covered.items()}
    assert 0.93 <= share["clustered"] <= 0.97, share
    assert share["independent"] < 0.92, share


def test_clustered_intervals_of_voters_with_one_vote_each_are_the_independent_ones() -> None:
    rng = np.random.default_rng(5)
    n, count = 6, 3000
    a = rng.integers(0, n, count)
    b = (a + rng.integers(1, n, count)) % n
    score = (rng.random(count) < 1.0 / (1.0 + np.exp(-(a - b) * 0.2))).astype(float)
    votes = ratings.VoterCells.from_votes(n, zip(range(count), a, b, score, strict=True))
    clustered = ratings.clustered_intervals(votes.outcomes(), votes)
    independent = ratings.sandwich_intervals(votes.outcomes())
    np.testing.assert_allclose(clustered.ratings, independent.ratings, atol=1e-6)
    # The same up to the small-sample factor and the prior's term in the Hessian.
    np.testing.assert_allclose(clustered.upper - clustered.ratings, independent.upper - independent.ratings, rtol=0.02)


def test_models_that_never_met_are_separate_groups_ranked_within_themselves() -> None:
    """A strong pair and a weak pair that never met: a -200 model is not put first beside a +400
    one; each group averages 1000 and ranks from 1, and the page says why."""
    rng = np.random.default_rng(3)
    games = []
    for first, second, gap in ((0, 1, 400.0), (2, 3, 200.0)):
        for _ in range(400):
            p = 1.0 / (1.0 + 10.0 ** (-gap / 400.0))
            games.append((first, second, float(rng.random() < p)))
    names = ["strong", "strong's rival", "weak", "weak's rival"]
    rows = board.compute_board(names, ratings.PairOutcomes.from_games(4, games), ci="sandwich")
    by_name = {row.model: row for row in rows}
    assert by_name["strong"].group == by_name["strong's rival"].group == 1
    assert by_name["weak"].group == by_name["weak's rival"].group == 2
    assert by_name["strong"].rank == by_name["weak"].rank == 1
    assert by_name["strong's rival"].rank == by_name["weak's rival"].rank == 2
    assert [row.model for row in rows] == ["strong", "strong's rival", "weak", "weak's rival"]
    for group in (1, 2):
        assert np.mean([row.rating for row in rows if row.group == group]) == pytest.approx(1000.0, abs=0.1)
    notes = wording.group_notes([row.as_dict() for row in rows])
    assert [note["group"] for note in notes] == [1, 2]
    assert notes[1]["models"] == ["weak", "weak's rival"]
    assert "never met" in notes[1]["reason"] and "not ranked against" in notes[1]["reason"]


def newcomer_arena(rng: np.random.Generator, newcomer_votes: int, newcomer_wins: bool) -> ratings.PairOutcomes:
    """Six settled models (2,000 votes, 50 points apart) and a seventh that won (or lost) each of
    its ``newcomer_votes`` votes."""
    games = []
    for _ in range(2000):
        a, b = rng.choice(6, 2, replace=False)
        games.append((int(a), int(b), float(rng.random() < 1.0 / (1.0 + 10.0 ** ((b - a) * 50.0 / 400.0)))))
    games += [(6, int(rng.integers(0, 6)), 1.0 if newcomer_wins else 0.0) for _ in range(newcomer_votes)]
    return ratings.PairOutcomes.from_games(7, games)


def test_an_unbeaten_model_has_an_open_upper_bound_and_ranks_by_its_lower_one() -> None:
    names = [f"m{i}" for i in range(6)] + ["newcomer"]
    for ci in ("bootstrap", "sandwich"):
        rows = board.compute_board(names, newcomer_arena(np.random.default_rng(1), 30, True), ci=ci, rounds=200)
        newcomer = next(row for row in rows if row.model == "newcomer")
        assert newcomer.upper_open and not newcomer.lower_open
        assert newcomer.upper is None and newcomer.lower is not None
        assert newcomer.rating == newcomer.lower  # The figure shown: what the votes support.
        assert newcomer.rank == 1 and rows[0].model == "newcomer"
        settled = [row for row in rows if row.model != "newcomer"]
        assert not any(row.upper_open or row.lower_open for row in settled)
        # Thirty wins put it above the settled models by a bound the votes support (about 350
        # points above its opponents: below that, 30 straight wins had less than a 2.5% chance).
        assert newcomer.lower > max(row.upper for row in settled)
        assert np.mean([row.rating for row in settled]) == pytest.approx(1000.0, abs=0.1)
        text = board.interval_text(newcomer.as_dict())
        assert text == f"≥ {newcomer.lower:.0f}, unbeaten"
    # Two straight wins support much less: the newcomer shares first place.
    rows = board.compute_board(names, newcomer_arena(np.random.default_rng(1), 2, True), ci="sandwich")
    newcomer = next(row for row in rows if row.model == "newcomer")
    assert newcomer.upper_open and newcomer.rank == 1
    assert newcomer.lower < max(row.upper for row in rows if row.model != "newcomer")


def test_an_unbeaten_newcomers_floor_holds_its_true_rating() -> None:
    """The audit's case: a newcomer truly 400 points above six settled models (spread evenly
    around their mean, so its true rating on the board's scale, centred on them, is 1400), with
    30 votes. In the arenas where it happens to win all 30 (about 5% of them), its floor must not
    claim more than that: 400 arenas, every unbeaten one checked."""
    rng = np.random.default_rng(8)
    names = [f"m{i}" for i in range(6)] + ["newcomer"]
    offsets = (np.arange(6) - 2.5) * 50.0
    unbeaten = covered = 0
    for _ in range(400):
        games = []
        for _ in range(2000):
            a, b = rng.choice(6, 2, replace=False)
            games.append(
                (int(a), int(b), float(rng.random() < 1.0 / (1.0 + 10.0 ** ((offsets[b] - offsets[a]) / 400.0))))
            )
        for _ in range(30):
            b = int(rng.integers(0, 6))
            games.append((6, b, float(rng.random() < 1.0 / (1.0 + 10.0 ** ((offsets[b] - 400.0) / 400.0)))))
        if not all(score == 1.0 for a, _, score in games if a == 6):
            continue
        unbeaten += 1
        rows = board.compute_board(names, ratings.PairOutcomes.from_games(7, games), ci="sandwich")
        newcomer = next(row for row in rows if row.model == "newcomer")
        assert newcomer.upper_open
        covered += newcomer.lower <= 1400.0
    assert unbeaten >= 10
    assert covered == unbeaten


def test_a_model_that_never_won_has_an_open_lower_bound() -> None:
    names = [f"m{i}" for i in range(6)] + ["newcomer"]
    rows = board.compute_board(names, newcomer_arena(np.random.default_rng(2), 12, False), ci="sandwich")
    newcomer = next(row for row in rows if row.model == "newcomer")
    assert newcomer.lower_open and not newcomer.upper_open
    assert newcomer.lower is None and newcomer.rating == newcomer.upper
    assert rows[-1].model == "newcomer"
    assert board.interval_text(newcomer.as_dict()) == f"≤ {newcomer.upper:.0f}, never won"


@pytest.mark.parametrize("ci", ["bootstrap", "sandwich"])
def test_one_battle_does_not_rank_its_two_models_first_and_second(ci: str) -> None:
    rows = board.compute_board(["winner", "loser"], ratings.PairOutcomes.from_games(2, [(0, 1, 1.0)]), ci=ci)
    assert [(row.model, row.rank) for row in rows] == [("winner", 1), ("loser", 1)]
    winner, loser = rows
    assert winner.upper_open and loser.lower_open
    # One win says little: the winner's floor is far below the loser's ceiling.
    assert winner.lower < loser.upper
    headline = wording.headline(
        [{**row.as_dict(), "provisional": True} for row in rows], measure="rating", evidence="votes"
    )
    assert "share first place" in headline


def test_a_tie_closes_both_ends() -> None:
    rows = board.compute_board(["a", "b"], ratings.PairOutcomes.from_games(2, [(0, 1, 0.5)]), ci="sandwich")
    assert not any(row.upper_open or row.lower_open for row in rows)
    assert all(row.rank == 1 for row in rows)


def test_style_controlled_intervals_clustered_by_voter_cover_at_the_nominal_rate() -> None:
    """Style control's sandwich intervals, clustered by voter as on the site: 200 arenas as above
    (taste sd 200), each vote with random style differences that do not sway it (so the ratings'
    truth is the same population rating). 1,600 checks: a standard error of about 0.55 points."""
    truth = population_ratings(TRUE, 200.0)
    rng = np.random.default_rng(11)
    covered = {"clustered": 0, "independent": 0}
    arenas = 200
    for _ in range(arenas):
        votes = arena_with_tastes(rng, 200.0)
        a, b = votes.first, votes.second
        score = np.array([1.0, 0.0, 0.5])[votes.outcome]
        differences = rng.uniform(-1.0, 1.0, (a.size, len(style.FEATURES)))
        outcomes = style.StyleOutcomes.from_arrays(TRUE.size, a, b, score, differences)
        voters = style.StyleVoters(
            TRUE.size, votes.voter, a, b, score, style.rounded_steps(differences) * style.BINS, votes.count
        )
        for name, fitted in (
            ("clustered", style.style_controlled(outcomes, voters=voters)),
            ("independent", style.style_controlled(outcomes)),
        ):
            centre = fitted.ratings.mean()
            covered[name] += int(((fitted.lower - centre <= truth) & (truth <= fitted.upper - centre)).sum())
    share = {name: count / (arenas * TRUE.size) for name, count in covered.items()}
    assert 0.93 <= share["clustered"] <= 0.97, share
    assert share["independent"] < 0.92, share


def test_the_style_controlled_board_keeps_groups_and_open_ends_too() -> None:
    """The overall board's style-control toggle: a single battle ranks nobody above the other,
    and models that never met are separate groups."""
    differences = np.zeros((1, len(style.FEATURES)))
    one = style.StyleOutcomes.from_arrays(2, np.array([0]), np.array([1]), np.array([1.0]), differences)
    rows, _ = board.compute_style_board(["winner", "loser"], one)
    assert [(row.model, row.rank, row.upper_open, row.lower_open) for row in rows] == [
        ("winner", 1, True, False),
        ("loser", 1, False, True),
    ]
    rng = np.random.default_rng(4)
    a = np.repeat([0, 2], 300)
    b = a + 1
    score = (rng.random(a.size) < 0.7).astype(float)
    split = style.StyleOutcomes.from_arrays(4, a, b, score, rng.uniform(-1, 1, (a.size, len(style.FEATURES))))
    rows, coefficients = board.compute_style_board(["a", "b", "c", "d"], split)
    assert [(row.model, row.group, row.rank) for row in rows] == [("a", 1, 1), ("b", 1, 2), ("c", 2, 1), ("d", 2, 2)]
    assert set(coefficients) == set(style.FEATURES)


@pytest.mark.django_db
def test_the_page_and_the_api_show_groups_and_open_ends_in_words(client) -> None:
    """Through the refresh: one battle between a and b (a won), and c and d who met only each
    other (a tie and a win each way): two groups, the first with open ends."""
    from inference.models import LLM
    from votes.models import Battle, Vote

    models = {
        name: LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048) for name in "abcd"
    }

    def battle(first: str, second: str, choice: str, voter: str) -> None:
        played = Battle.objects.create(
            model_a=models[first], model_b=models[second], voter_key=voter, state=Battle.State.ENDED
        )
        Vote.objects.create(battle=played, choice=choice, stage=Vote.Stage.FIRST_TRY)

    battle("a", "b", "a", "v1")
    for choice, voter in (("a", "v2"), ("b", "v3"), ("tie", "v4")):
        battle("c", "d", choice, voter)
    html = client.get("/leaderboard/").content.decode()  # The first visit refreshes the board.
    board_json = client.get("/api/v1/leaderboard").json()
    assert board_json["method"] == "voter-clustered"
    rows = {row["model"]: row for row in board_json["rows"]}
    assert rows["a"]["upper_open"] and rows["a"]["upper"] is None and rows["a"]["bound_note"] == "unbeaten"
    assert rows["b"]["lower_open"] and rows["b"]["lower"] is None and rows["b"]["bound_note"] == "never won"
    assert rows["a"]["rank"] == rows["b"]["rank"] == 1
    assert {rows[name]["group"] for name in "ab"} != {rows[name]["group"] for name in "cd"}
    assert [group["models"] for group in board_json["groups"]] in (
        [["a", "b"], ["c", "d"]],
        [["c", "d"], ["a", "b"]],
    )
    assert f"≥ {rows['a']['lower']:.0f}, unbeaten" in html and f"≤ {rows['b']['upper']:.0f}, never won" in html
    assert "groups that never met" in html and "Group 2: These models never met a model of group 1" in html


def test_a_model_that_never_met_the_settled_ones_either_way_has_no_bound() -> None:
    """Model 3 lost only to model 2, which beat the settled pair 0-1: above or below the pair,
    the votes cannot say, so neither of its bounds is finite."""
    games = [(0, 1, 1.0), (1, 0, 1.0), (0, 1, 0.5), (2, 0, 1.0), (2, 1, 1.0), *[(2, 3, 1.0)] * 3]
    fit = ratings.rate_board(ratings.PairOutcomes.from_games(4, games), ci="sandwich")
    assert fit.upper_open[3] and fit.lower_open[3]
    assert fit.lower[3] == -np.inf and fit.upper[3] == np.inf


def test_intervals_of_no_width_a_hair_apart_share_a_rank() -> None:
    lower, upper = np.array([1000.0, 1000.000001]), np.array([1000.0, 1000.000001])
    assert ratings.ranks_from_intervals(lower, upper).tolist() == [1, 1]
    assert ratings.ranks_from_intervals(np.array([900.0, 1000.0]), np.array([950.0, 1100.0])).tolist() == [2, 1]
