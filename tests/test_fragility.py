"""Rank fragility (leaderboard.fragility): the votes whose removal swaps adjacent rows, checked by
refitting without them, against known cases and against the exact minimum on small boards."""

import itertools

import numpy as np
import pytest

from leaderboard import bench, board, fragility, ratings


def _gap_after(outcomes: ratings.PairOutcomes, order: list[int], position: int, k: int, **options) -> float:
    """The gap in log strength of rows ``position`` and ``position + 1``, refitted (by
    ``ratings.bradley_terry``) without the search's first ``k`` votes for that pair (with the
    full data's pair weights, as the search keeps); level at ``fragility.LEVEL`` or below."""
    weights = ratings._checked_weights(outcomes, options.get("pair_weights"))
    left = fragility.removed_votes(outcomes, order, position, k, **options)
    fitted = ratings.bradley_terry(left.wins(weights), prior=options.get("prior"))
    return float(fitted[order[position]] - fitted[order[position + 1]]) / ratings._TO_RATING


def _checked(outcomes: ratings.PairOutcomes, order: list[int], **options) -> list[int | None]:
    """swap_votes, each count checked: removing it swaps the pair, removing one fewer does not."""
    counts = fragility.swap_votes(outcomes, order, **options)
    assert len(counts) == len(order) and counts[-1] is None
    for position, k in enumerate(counts[:-1]):
        assert k is not None
        assert _gap_after(outcomes, order, position, k, **options) <= fragility.LEVEL
        if k > 0:
            assert _gap_after(outcomes, order, position, k - 1, **options) > fragility.LEVEL
    return counts


def _order(outcomes: ratings.PairOutcomes, **options) -> list[int]:
    fitted = ratings.bradley_terry(outcomes.wins(ratings._checked_weights(outcomes, options.get("pair_weights"))))
    return [int(i) for i in np.argsort(-fitted, kind="stable")]


def test_a_close_pair_swaps_after_a_handful_of_votes_and_a_distant_one_after_many() -> None:
    # Four models: 0 and 1 close (13 to 10 between them, alike against 2 and 3), 2 far below 1
    # (200 to 20 against each of 0 and 1), 3 far below 2.
    cells = {
        (0, 1): (13, 10, 2),
        (0, 2): (200, 20, 5),
        (1, 2): (200, 20, 5),
        (0, 3): (300, 5, 0),
        (1, 3): (300, 5, 0),
        (2, 3): (200, 20, 5),
    }
    outcomes = ratings.PairOutcomes.from_cells(4, cells)
    order = _order(outcomes)
    assert order == [0, 1, 2, 3]
    close, distant, last = _checked(outcomes, order)[:3]
    assert 1 <= close <= 5
    assert distant >= 100
    assert last >= 100


def test_models_level_in_rating_are_zero_votes_from_swapping() -> None:
    # 0 and 1 have the same record against each other and against 2: level.
    outcomes = ratings.PairOutcomes.from_cells(3, {(0, 1): (7, 7, 2), (0, 2): (20, 5, 1), (1, 2): (20, 5, 1)})
    counts = _checked(outcomes, _order(outcomes))
    assert counts[0] == 0 and counts[1] > 0


def test_one_vote_is_one_vote_from_swapping() -> None:
    outcomes = ratings.PairOutcomes.from_cells(2, {(0, 1): (1, 0, 0)})
    assert _checked(outcomes, [0, 1]) == [1, None]


def test_every_pair_of_a_large_board_is_checked_by_refits() -> None:
    """40 models, 200,000 votes from known strengths: every count swaps its pair when removed
    and refitted, and one fewer does not; the counts grow with the rating gap."""
    a, b, score = bench.synthetic_votes(200_000, 40, seed=3)
    outcomes = bench.reduce_to_outcomes(40, a, b, score)
    order = _order(outcomes)
    counts = _checked(outcomes, order)
    fitted = ratings.bradley_terry(outcomes.wins())
    gaps = fitted[order[:-1]] - fitted[order[1:]]
    assert np.corrcoef(gaps, counts[:-1])[0, 1] > 0.8


def test_pair_weights_and_prior_are_those_of_the_board() -> None:
    a, b, score = bench.synthetic_votes(20_000, 8, seed=4)
    outcomes = bench.reduce_to_outcomes(8, a, b, score)
    weights = np.random.default_rng(4).uniform(0.5, 2.0, outcomes.first.size)
    options = {"pair_weights": weights, "prior": 0.5}
    _checked(outcomes, _order(outcomes, **options), **options)


def _exact_minimum(outcomes: ratings.PairOutcomes, upper: int, lower: int, most: int) -> int | None:
    """The fewest votes (at most ``most``) whose removal brings ``lower`` level with ``upper``,
    by trying every removal of 1, 2, ... votes (None: none up to ``most``)."""
    counts = np.stack([outcomes.first_wins, outcomes.second_wins, outcomes.ties], axis=1).astype(int)  # (pairs, 3)
    cells = [(p, o) for p in range(counts.shape[0]) for o in range(3) if counts[p, o] > 0]
    for size in range(1, most + 1):
        removals = [
            combination
            for combination in itertools.combinations_with_replacement(range(len(cells)), size)
            if all(combination.count(c) <= counts[cells[c]] for c in set(combination))
        ]
        wins = np.zeros((len(removals), outcomes.n_models, outcomes.n_models))
        wins[:] = outcomes.wins()
        for row, combination in enumerate(removals):
            for c in combination:
                pair, outcome = cells[c]
                i, j = outcomes.first[pair], outcomes.second[pair]
                share = (1.0, 0.0, 0.5)[outcome]
                wins[row, i, j] -= share
                wins[row, j, i] -= 1.0 - share
        theta = ratings._fit_log_strengths(wins, ratings.default_prior(outcomes.n_models))
        if np.any(theta[:, upper] - theta[:, lower] <= fragility.LEVEL):
            return size
    return None


def test_the_count_is_the_exact_minimum_on_small_boards() -> None:
    """Random boards of 4 models and 3-8 votes per pair, every adjacent pair the search puts 1 to
    6 votes from swapping: the exact minimum found by trying every removal of fewer votes. The
    search's count can only be an upper bound of it (its removal does swap); on these boards it
    is the minimum every time."""
    rng = np.random.default_rng(7)
    compared = equal = 0
    for _ in range(30):
        cells = {
            pair: tuple(rng.multinomial(rng.integers(3, 9), [0.45, 0.45, 0.1]))
            for pair in itertools.combinations(range(4), 2)
        }
        outcomes = ratings.PairOutcomes.from_cells(4, cells)
        order = _order(outcomes)
        counts = _checked(outcomes, order)
        for position, k in enumerate(counts[:-1]):
            if not 1 <= k <= 6:
                continue
            exact = _exact_minimum(outcomes, order[position], order[position + 1], k)
            assert exact is not None and exact <= k
            compared += 1
            equal += exact == k
    assert compared >= 60
    assert equal == compared


def test_board_rows_carry_the_counts() -> None:
    a, b, score = bench.synthetic_votes(5000, 6, seed=5)
    outcomes = bench.reduce_to_outcomes(6, a, b, score)
    rows = board.compute_board([f"m{i}" for i in range(6)], outcomes, rounds=20)
    order = [int(row.model[1:]) for row in rows]
    assert [row.swap_votes for row in rows] == fragility.swap_votes(outcomes, order)
    assert rows[-1].swap_votes is None and all(row.swap_votes is not None for row in rows[:-1])
    assert rows[0].as_dict()["swap_votes"] == rows[0].swap_votes


@pytest.mark.parametrize("models", [0, 1])
def test_boards_too_small_for_a_pair(models: int) -> None:
    outcomes = ratings.PairOutcomes.from_cells(max(models, 1), {})
    assert fragility.swap_votes(outcomes, list(range(models))) == [None] * models
