"""A reply's leading and trailing whitespace, and its family's habitual prefix, never reach the
voter (inference.reply_edges): a model that starts every reply with a space, or with its
template's role line, would be named by it."""

import pytest

from inference.chat_templates import FAMILIES
from inference.reply_edges import (
    FAMILY_PREFIXES,
    without_edge_whitespace,
    without_family_prefix,
    without_family_prefix_text,
)


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


@pytest.mark.parametrize(
    ("family", "deltas", "shown"),
    [
        # The template's own role line or marker, echoed at the start: dropped, one rule per family.
        ("gemma", ["<start_of_turn>", "model", "\n", "Booked."], "Booked."),
        ("gemma", ["model\nBooked."], "Booked."),
        ("llama3", ["<|start_header_id|>assistant<|end_header_id|>\n\n", "Hi"], "Hi"),
        ("llama3", ["assis", "tant\n\nHi there"], "Hi there"),
        ("chatml", [" <|im_start|>assistant\n", "Hi"], "Hi"),
        ("chatml", ["assistant\nassistant\nHi"], "Hi"),  # Again while one follows another.
        ("mistral", [" [/INST] Hi"], "Hi"),
        ("vicuna", ["ASSISTANT: Hi"], "Hi"),
        ("completion", [" Assistant: Hi"], "Hi"),
        # Only at the start, only the family's own, never the model's words.
        ("gemma", ["Hi, model\nhere"], "Hi, model\nhere"),
        ("gemma", ["assistant\nHi"], "assistant\nHi"),
        ("chatml", ["Sure! ", "assistant\n"], "Sure! assistant"),
        ("llama3", ["assistants are ", "helpful"], "assistants are helpful"),
        ("llama3", ["assist"], "assist"),  # The reply ended while it could still have been one.
        ("vicuna", [], ""),
    ],
)
def test_a_familys_habitual_prefix_is_dropped(family: str, deltas: list[str], shown: str) -> None:
    assert "".join(without_edge_whitespace(without_family_prefix(family, deltas))) == shown
    assert without_family_prefix_text(family, "".join(deltas)).strip() == shown


def test_the_prefix_rule_holds_the_start_back_as_ticks_and_lets_the_rest_through() -> None:
    out = list(without_family_prefix("chatml", ["assis", "", "tant\n", "Hi", " there"]))
    assert out == ["", "", "", "Hi", " there"]  # One delta out per delta in while deciding.
    assert list(without_family_prefix("chatml", ["Hello", " you"])) == ["Hello", " you"]  # Decided at once.


def test_every_family_of_the_roster_has_a_rule_and_an_unknown_one_is_refused() -> None:
    assert set(FAMILY_PREFIXES) == set(FAMILIES)
    with pytest.raises(ValueError, match="Unknown model family 'gpt'"):
        list(without_family_prefix("gpt", ["Hi"]))
