"""Bradley-Terry and Elo, tested as plain math."""

import numpy as np
import pytest

from leaderboard import ratings


def test_win_matrix_counts_ties_as_half_wins() -> None:
    wins = ratings.win_matrix(3, [(0, 1, 1.0), (0, 1, 0.5), (2, 0, 0.0)])
    assert wins.tolist() == [[0, 1.5, 1.0], [0.5, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError):
        ratings.win_matrix(2, [(1, 1, 1.0)])


def test_bradley_terry_recovers_known_strengths() -> None:
    # Expected win counts under strengths 4:2:1 -> the fit returns those ratios (prior off).
    strengths = np.array([4.0, 2.0, 1.0])
    wins = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            if i != j:
                wins[i, j] = 1000 * strengths[i] / (strengths[i] + strengths[j])
    fitted = ratings.bradley_terry(wins, prior=0.0)
    expected = 400 * np.log10(strengths / np.exp(np.log(strengths).mean())) + 1000
    np.testing.assert_allclose(fitted, expected, atol=1e-3)
    assert fitted.mean() == pytest.approx(1000)


def test_bradley_terry_stays_finite_for_unbeaten_and_unplayed_models() -> None:
    wins = ratings.win_matrix(3, [(0, 1, 1.0)] * 5)
    fitted = ratings.bradley_terry(wins)
    assert np.all(np.isfinite(fitted))
    assert fitted[0] > fitted[2] > fitted[1]
    assert ratings.bradley_terry(np.zeros((2, 2))).tolist() == [1000.0, 1000.0]
    assert ratings.bradley_terry(np.zeros((0, 0))).size == 0


def test_online_elo_is_zero_sum_and_order_dependent() -> None:
    elo = ratings.online_elo(2, [(0, 1, 1.0)], k=32)
    assert elo.tolist() == [1016.0, 984.0]
    forward = ratings.online_elo(3, [(0, 1, 1.0), (1, 2, 1.0), (2, 0, 1.0)])
    backward = ratings.online_elo(3, [(2, 0, 1.0), (1, 2, 1.0), (0, 1, 1.0)])
    assert forward.sum() == pytest.approx(3000)
    assert not np.allclose(forward, backward)


def test_vote_scores_cover_every_choice() -> None:
    assert ratings.VOTE_SCORES == {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}
