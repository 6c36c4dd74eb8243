"""The seed-shaped training dialogs (inference/building/dialog_data.py): what they hold, what the
loss counts, and held-out items disjoint from training by construction."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter

import pytest

from inference.building import dialog_data as dd
from votes.evaluation import DECOYS, FALLBACK_HUMAN_CORRECTION, GENERIC_CORRECTION, HUMAN_CORRECTIONS, correction_for

ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{\w+\})", template)
    return re.compile("".join(".*?" if p.startswith("{") else re.escape(p) for p in parts) + "$")


PATTERNS = {
    split: [_pattern(t) for kind in dd.TEMPLATES.values() for t in kind[index]]
    for index, split in enumerate(("train", "eval"))
}


# The scenario's corrections: both splits say them (they are the feedback being measured).
CORRECTIONS = {*DECOYS, GENERIC_CORRECTION, FALLBACK_HUMAN_CORRECTION, *(text for _, text in HUMAN_CORRECTIONS)}


def _split_of(sentence: str) -> set[str]:
    """Which split's request templates ``sentence`` matches (none for a correction)."""
    if sentence in CORRECTIONS:
        return set()
    return {split for split, patterns in PATTERNS.items() if any(p.match(sentence) for p in patterns)}


@pytest.fixture(scope="module")
def training() -> list[dd.Example]:
    return dd.training_dialogs(0, 3000)


@pytest.fixture(scope="module")
def held_out() -> list[dd.HeldOut]:
    return dd.held_out_first(0, 200) + dd.held_out_corrections(0, 200) + dd.held_out_decoys(0, 200)


def test_the_seed_prompts_have_only_held_out_shapes_and_are_never_trained_on(training: list[dd.Example]) -> None:
    for prompt in dd.SEED_PROMPTS:
        assert _split_of(prompt) == {"eval"}, prompt
    said = {turn.content for example in training for turn in example.turns if turn.role == "user"}
    assert not said & set(dd.SEED_PROMPTS)
    assert not {"Fred", "Paul"} & {word.strip(".,") for sentence in said for word in sentence.split()}


def test_held_out_names_months_and_phrasings_never_appear_in_training(
    training: list[dd.Example], held_out: list[dd.HeldOut]
) -> None:
    train, evaluation = dd.SPLITS["train"], dd.SPLITS["eval"]
    assert not set(train.names) & set(evaluation.names)
    assert not {title for _, title in train.events} & {title for _, title in evaluation.events}

    def requests(turns: tuple[dd.ChatTurn, ...]) -> list[str]:
        return [t.content for t in turns if t.role == "user" and _split_of(t.content)]

    training_text = " ".join(turn.content for example in training for turn in example.turns)
    for name in evaluation.names:
        assert not re.search(rf"\b{name}\b", training_text), name
    dates = {
        split: {m.group() for m in ISO_DATE.finditer(text)}
        for split, text in (("train", training_text), ("eval", " ".join(t.content for i in held_out for t in i.turns)))
    }
    assert len(dates["train"]) > 300 and len(dates["eval"]) > 100
    assert not {d[5:] for d in dates["train"]} & {d[5:] for d in dates["eval"]}  # No month and day in both.
    assert {d[5:7] for d in dates["train"]} == {f"{m:02d}" for m in range(1, 13)}  # Every month trains.
    assert all(dd.date_split(dt.date.fromisoformat(d)) == "eval" for d in dates["eval"])
    trained_requests = [r for example in training for r in requests(example.turns)]
    held_requests = [r for item in held_out for r in requests(item.turns)]
    assert len(trained_requests) > 5000 and len(held_requests) > 500
    assert all(_split_of(r) == {"train"} for r in trained_requests)
    assert all(_split_of(r) == {"eval"} for r in held_requests)
    held_text = " ".join(turn.content for item in held_out for turn in item.turns)
    for name in train.names:
        assert not re.search(rf"\b{name}\b", held_text), name


def test_the_loss_counts_only_replies_to_imitate(training: list[dd.Example]) -> None:
    corrections: Counter[str] = Counter()
    for example in training:
        replies = [i for i, turn in enumerate(example.turns) if turn.role == "assistant"]
        assert len(replies) == len(example.trained)
        for position, (index, trained) in enumerate(zip(replies, example.trained, strict=True)):
            reply = example.turns[index].content
            if trained:
                assert re.fullmatch(r"action\.(add|remove)_calendar_entry\(.*\)", reply), reply
                continue
            # A mistaken reply is never the last: a correction follows, then (in the end) the fix.
            assert position < len(replies) - 1
            correction = example.turns[index + 1].content
            fix = next(
                example.turns[i].content
                for i, t in zip(replies[position:], example.trained[position:], strict=True)
                if t
            )
            assert dd.judge(reply, fix).verdict != "correct"
            kind = "generic" if correction == GENERIC_CORRECTION else "checker" if "expected" in correction else "other"
            corrections[kind] += 1
        if example.label == "decoy":
            decoy = next(i for i, t in enumerate(example.turns) if t.role == "user" and t.content in DECOYS and i > 1)
            assert example.turns[decoy - 1].content == example.turns[decoy + 1].content  # the call is kept
            assert example.trained[replies.index(decoy + 1)]
    assert min(corrections.values()) > 200, corrections
    labels = Counter(example.label for example in training)
    assert labels["twelve_hour"] == max(n for label, n in labels.items() if label not in ("", "decoy"))
    assert {"chatter", "no_call", "wrong_call", "year", "day", "duration", "decoy"} <= set(labels)
    assert Counter(example.kind for example in training)["first"] > 500  # single first requests
    long = [e for e in training if sum(t.role == "user" for t in e.turns) >= 5]
    assert len(long) > 300
    user_text = " ".join(t.content for e in training for t in e.turns if t.role == "user")
    for said in ("same day", "next day", "noon", "1/2h", "hours", "PM", "pm", "Remove", "We are in"):
        assert said in user_text, said


def test_ablation_recipes_leave_out_what_they_name() -> None:
    plain = dd.training_dialogs(1, 400, dd.Recipe(corrections=False, decoys=False))
    assert all(all(example.trained) for example in plain)
    assert not any(t.content in DECOYS for e in plain for t in e.turns if t.role == "user")
    no_decoys = dd.training_dialogs(1, 400, dd.Recipe(decoys=False))
    assert any(not all(e.trained) for e in no_decoys)
    assert all(e.label != "decoy" for e in no_decoys)


def test_held_out_mistakes_are_corrected_three_ways_from_the_same_point() -> None:
    items = dd.held_out_corrections(3, 40)
    assert len(items) == 120
    for generic, human, checker in zip(items[::3], items[1::3], items[2::3], strict=True):
        assert (generic.kind, human.kind, checker.kind) == dd.FEEDBACK_KINDS
        assert generic.turns[:-1] == human.turns[:-1] == checker.turns[:-1]
        assert generic.turns[-1].content == GENERIC_CORRECTION
        assert checker.turns[-1].content == correction_for(dd.judge(checker.turns[-2].content, checker.expected))
        assert human.turns[-1].content in CORRECTIONS
        assert dd.judge(generic.turns[-2].content, generic.expected).verdict != "correct"
    for item in dd.held_out_decoys(3, 30):
        assert item.turns[-1].content in DECOYS and item.turns[-2].content == item.expected
