"""A reply's leading and trailing whitespace never reaches the voter (inference.reply_edges):
a model that starts every reply with a space would be named by it."""

import pytest

from inference.reply_edges import without_edge_whitespace


@pytest.mark.parametrize(
    ("deltas", "shown"),
    [
        ([" Hello", " world", "!"], "Hello world!"),
        (["  ", "\n", " Hi", "  there ", " \n", ""], "Hi  there"),  # Inside: kept as written.
        (["Done.", " ", "\n\n", "  "], "Done."),  # Trailing: held back, never sent.
        (["a", " ", "", " ", "b "], "a  b"),  # A tick between whitespace and text changes nothing.
        ([" ", "\t", ""], ""),
        ([], ""),
    ],
)
def test_edges_are_dropped_and_the_inside_kept(deltas: list[str], shown: str) -> None:
    assert "".join(without_edge_whitespace(deltas)) == shown


def test_every_delta_still_comes_out_so_ticks_keep_their_timing() -> None:
    deltas = [" ", "", "Hi", " ", "", "you", "  "]
    out = list(without_edge_whitespace(deltas))
    assert len(out) == len(deltas)
    assert out[1] == "" and out[4] == ""  # The engine's ticks pass through as ticks.
    assert "".join(out) == "Hi you"
