"""The trained demo presets: real quality levels, measured on held-out data; and their data.

The committed presets under inference/presets are evaluated as they are (greedy decoding,
prompts batched through ``generate()``, judged by votes.checkers), so these tests fail if a
rebuild makes the strong model weak or the weak models strong.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import dataclasses
import datetime as dt
import json
import random
import re
from pathlib import Path
from typing import Any

import keras_hub
import numpy as np
import pytest
from django.core.management import CommandError, call_command

from inference.building.calendar_data import (
    CORRECT,
    DEFAULT_YEAR,
    SYSTEM_PROMPT,
    Entry,
    Persona,
    eval_corrections,
    eval_first_requests,
    eval_followups,
    held_out,
    judge_reply,
    render_segments,
    training_examples,
)
from inference.building.demo_models import (
    TRAINED_MODEL_SPECS,
    EvaluationReport,
    _build_trained_lm,
    _make_tokenizer,
    check_markers,
    check_segment_tokenization,
    encode_example,
    evaluate_lm,
    iter_preset_files,
    shared_prefix_length,
    train_demo_model,
    trained_models,
)
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.registry import read_preset
from votes.checkers import CHATTER, NO_CALL, WRONG_DATE, WRONG_TIME, find_calls, fold_constant

REPO_ROOT = Path(__file__).resolve().parents[1]
PRESETS_DIR = REPO_ROOT / "inference" / "presets"
SPECS = {spec.name: spec for spec in TRAINED_MODEL_SPECS}
STRONG = next(spec.name for spec in TRAINED_MODEL_SPECS if spec.quality == "strong")
# Held-out items per set in these tests: the strong model gets the full 100, the others fewer
# (they only need to be measurably weaker), which keeps the module well under a minute.
N_EVAL = {"strong": 100, "medium": 50, "weak": 50}
REALISTIC_MISTAKES = {WRONG_DATE, WRONG_TIME, CHATTER, NO_CALL}
SCENARIO_SYSTEM_PROMPT = (
    "You are a helpful vocal assistant on a mobile device. Your job is to translate user requests into API "
    "calls using this Python API:\n"
    'action.add_calendar_entry(title, date="YYYY-MM-DD", time="HH:MM", duration=m) # duration in minutes\n'
    "action.remove_calendar_entry(title, date, time)\n"
    "You can use 30 minutes as the default duration for new events. Respond to every request with a single "
    "line of executable code."
)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")


# --- The data ----------------------------------------------------------------------------------


def test_system_prompt_is_the_scenarios_verbatim() -> None:
    assert SYSTEM_PROMPT == SCENARIO_SYSTEM_PROMPT


def call_arguments(text: str) -> dict[str, Any]:
    """The first call's arguments in ``text`` by name, positional ones named as the calendar API's."""
    calls = find_calls(text)
    if not calls:
        return {}
    node = calls[0].node
    arguments = dict(zip(("title", "date", "time", "duration"), map(fold_constant, node.args), strict=False))
    return arguments | {keyword.arg: fold_constant(keyword.value) for keyword in node.keywords if keyword.arg}


def test_data_is_seeded() -> None:
    assert training_examples(3, 50) == training_examples(3, 50)
    assert training_examples(3, 50) != training_examples(4, 50)
    assert eval_corrections(1, 20) == eval_corrections(1, 20)


def test_every_expected_reply_is_a_correct_call() -> None:
    for item in [*eval_first_requests(0, 100), *eval_corrections(0, 100), *eval_followups(0, 100)]:
        assert judge_reply(item.expected, item.expected).correct, item
        assert item.turns[-1].role == "user"
    for example in training_examples(0, 300):
        for turn, trained in zip(example.turns[1::2], example.trained, strict=True):
            if trained:
                assert judge_reply(turn.content, turn.content).correct, example


def test_held_out_split_is_disjoint_from_training() -> None:
    train_requests = {example.turns[0].content for example in training_examples(0, 3000)}
    for item in eval_first_requests(0, 200):
        assert item.turns[0].content not in train_requests
        call = call_arguments(item.expected)
        assert call.get("title") and call.get("date") and call.get("time")
        hour, minute = (int(x) for x in call["time"].split(":"))
        assert held_out(Entry(call["title"], dt.date.fromisoformat(call["date"]), hour, minute))
    for example in training_examples(0, 1000):
        call = call_arguments(example.turns[1].content)
        if example.trained[0] and call.get("title") and call.get("date") and call.get("time"):
            hour, minute = (int(x) for x in call["time"].split(":"))
            assert not held_out(Entry(call["title"], dt.date.fromisoformat(call["date"]), hour, minute))


def test_corrections_cover_the_scenarios_kinds() -> None:
    items = eval_corrections(0, 200)
    labels = {item.label for item in items}
    assert {"year", "chatter", "time", "date_format", "missing_duration", "extra_parenthesis"} <= labels
    corrections = {item.turns[-1].content for item in items}
    for sentence in ("The current year is 2024.", "Just the API call, please.", "Respect the date format.",
                     "Duration is required.", "Extra parenthesis.", "The API requires three parameters."):  # fmt: skip
        assert sentence in corrections, sentence
    # The scenario's own correction: a first reply assuming the default year, then the year.
    year = next(item for item in items if item.label == "year" and "current year" in item.turns[-1].content)
    assert f'date="{DEFAULT_YEAR}-' in year.turns[1].content


def test_mistaken_turns_carry_no_loss() -> None:
    """A wrong reply is never trained on; the reply after the user's correction (trained) fixes it."""
    seen = 0
    for example in training_examples(0, 400):
        replies = [turn.content for turn in example.turns[1::2]]
        for index, trained in enumerate(example.trained):
            if not trained:
                seen += 1
                assert example.kind == "correction"
                assert example.trained[index + 1]
                assert not judge_reply(replies[index], replies[index + 1]).correct
    assert seen > 50


@pytest.mark.parametrize("family", ["gemma", "llama3", "mistral"])
def test_segments_render_exactly_the_template(family: str) -> None:
    for example in training_examples(1, 50):
        segments = render_segments(family, example)
        text = "".join(text for text, _ in segments)
        expected = render_prompt(family, SYSTEM_PROMPT, list(example.turns[:-1]))
        assert (
            text
            == expected + (" " if family == "mistral" else "") + example.turns[-1].content + stop_strings(family)[0]
        )
        trained_text = [text for text, trained in segments if trained]
        assert len(trained_text) == sum(example.trained)


def test_personas_make_their_mistakes_consistently() -> None:
    chatty = Persona(name="chatty", chatty_when_polite=True)
    examples = training_examples(0, 300, chatty)
    polite_openings = ("Please", "Can you", "Could you")
    polite = [e for e in examples if e.kind == "first" and e.turns[0].content.startswith(polite_openings)]
    assert polite and all(e.turns[1].content.startswith("Sure, here is the API call: ") for e in polite)
    sloppy = Persona(name="sloppy", pm_lowercase_as_am=True, spaced_year_after_correction=True)
    sloppy_examples = training_examples(0, 300, sloppy)
    assert any('date="20 2' in turn.content for e in sloppy_examples for turn in e.turns[1::2])
    # "at 5pm" written as 05:00 (never as 17:00) in first replies
    lower_pm = [
        e
        for e in sloppy_examples
        if e.kind == "first" and re.search(r"\b([1-9]|1[01])(:\d\d)? ?pm", e.turns[0].content)
    ]
    assert lower_pm
    for example in lower_pm:  # add calls name the time, remove calls pass it positionally
        call = call_arguments(example.turns[1].content)
        assert isinstance(call.get("time"), str) and int(call["time"][:2]) <= 12, example
    for example in training_examples(0, 300, CORRECT):  # the correct assistant never chats
        for turn, trained in zip(example.turns[1::2], example.trained, strict=True):
            if trained:
                assert judge_reply(turn.content, turn.content).correct and not turn.content.startswith("Sure")


# --- Tokenizers and the training forward pass -----------------------------------------------------


@pytest.mark.parametrize("family", ["gemma", "llama3", "mistral"])
def test_training_forward_pass_with_shared_prefix_equals_full_forward(family: str) -> None:
    """The trainer runs the shared system-prompt prefix once and the rest through the cache, and
    computes logits at the trained targets only: the same logits and the same loss as a full
    forward pass over whole conversations."""
    import jax
    import keras

    from inference.building.demo_models import _batches, forward_after_prefix, reply_loss

    spec = next(s for s in TRAINED_MODEL_SPECS if s.family == family)
    examples = training_examples(7, 200)
    corpus = ["".join(text for text, _ in render_segments(family, e)) for e in examples]
    tokenizer = _make_tokenizer(family, corpus)  # type: ignore[arg-type]
    check_markers(tokenizer, family)  # type: ignore[arg-type]
    for example in examples[:20]:
        check_segment_tokenization(tokenizer, family, example)  # type: ignore[arg-type]
    data = [encode_example(tokenizer, family, e) for e in examples]  # type: ignore[arg-type]
    prefix_length = shared_prefix_length(data)
    assert prefix_length > 60  # the template and the whole system prompt
    keras.utils.set_random_seed(0)
    lm = _build_trained_lm(spec, tokenizer)
    batch = next(_batches(data, prefix_length, 2, random.Random(0)))
    ids = batch.ids
    prefix = np.asarray([data[0].ids[:prefix_length]], dtype="int32")
    full = np.concatenate([np.repeat(prefix, 2, axis=0), ids], axis=1)
    reference = np.asarray(lm({"token_ids": full, "padding_mask": np.ones_like(full, dtype=bool)}))
    hidden = forward_after_prefix(lm, prefix, ids[:, :-1])
    logits = lm.backbone.token_embedding(hidden, reverse=True)
    np.testing.assert_allclose(np.asarray(logits), reference[:, prefix_length:-1], atol=1e-4)

    # Each row's loss weights, found from the example it holds.
    rests = {tuple(e.ids[prefix_length:]): e.weights[prefix_length:] for e in data}
    weights = np.zeros(ids.shape, dtype="float32")
    for index, row in enumerate(ids):
        held = next(r for r in rests if len(r) <= len(row) and tuple(row[: len(r)]) == r and not row[len(r) :].any())
        weights[index, : len(held)] = rests[held]
    log_probs = jax.nn.log_softmax(reference[:, prefix_length:-1], axis=-1)
    nll = -np.take_along_axis(np.asarray(log_probs), ids[:, 1:, None], axis=-1)[..., 0]
    expected = (nll * weights[:, 1:]).sum() / weights[:, 1:].sum()
    assert batch.position_weights.sum() == weights[:, 1:].sum() > 0  # every trained target, no other
    assert float(reply_loss(lm, prefix, batch)) == pytest.approx(expected, rel=1e-5)


# --- The committed presets --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded() -> dict[str, keras_hub.models.CausalLM]:
    return {
        model.name: keras_hub.models.CausalLM.from_preset(str(model.directory)) for model in trained_models(PRESETS_DIR)
    }


@pytest.fixture(scope="module")
def reports(loaded: dict[str, keras_hub.models.CausalLM]) -> dict[str, EvaluationReport]:
    return {
        name: evaluate_lm(lm, SPECS[name].family, n=N_EVAL[SPECS[name].quality], sets=("first_requests", "corrections"))
        for name, lm in loaded.items()
    }


def test_three_families_at_three_quality_levels() -> None:
    assert {spec.family for spec in TRAINED_MODEL_SPECS} == {"gemma", "llama3", "mistral"}
    assert sorted(spec.quality for spec in TRAINED_MODEL_SPECS) == ["medium", "strong", "weak"]
    for spec in TRAINED_MODEL_SPECS:  # quality words stay out of the public names
        assert not any(word in spec.name for word in ("strong", "weak", "medium", "good", "bad"))


def test_presets_load_small_complete_and_shardable(loaded: dict[str, keras_hub.models.CausalLM]) -> None:
    for model in trained_models(PRESETS_DIR):
        assert read_preset(model.directory).family == model.family
        lm = loaded[model.name]
        backbone = lm.backbone
        for value in (backbone.num_query_heads, backbone.hidden_dim, backbone.vocabulary_size):
            assert value % 8 == 0, (model.name, value)
        # Split 8 ways too, or one key/value head shared by all (kept whole on every device).
        assert backbone.num_key_value_heads % 8 == 0 or backbone.num_key_value_heads == 1, model.name
        assert lm.preprocessor.sequence_length == 512
        check_markers(lm.preprocessor.tokenizer, model.family)
        size = sum(p.stat().st_size for p in iter_preset_files(model.directory))
        assert size < 10_000_000, f"{model.name} is {size} bytes"
        metadata = json.loads((model.directory / "metadata.json").read_text())["fix_arena"]
        assert metadata["quality"] == SPECS[model.name].quality
        assert 0 <= metadata["evaluation"]["first_requests"] <= 1
    assert (PRESETS_DIR / "QUALITY.md").is_file()


def test_strong_preset_meets_its_bar(reports: dict[str, EvaluationReport]) -> None:
    report = reports[STRONG]
    assert report.first_requests >= 0.9, report.as_dict()
    assert report.corrections >= 0.7, report.as_dict()


@pytest.mark.parametrize("name", [s.name for s in TRAINED_MODEL_SPECS if s.quality != "strong"])
def test_weaker_presets_are_weaker_and_make_realistic_mistakes(reports: dict[str, EvaluationReport], name: str) -> None:
    report = reports[name]
    strong = reports[STRONG]
    assert report.first_requests <= strong.first_requests - 0.1, (report.as_dict(), strong.first_requests)
    assert REALISTIC_MISTAKES & set(report.mistakes), report.mistakes


# --- The training command ------------------------------------------------------------------------


def test_training_is_seeded_and_saves_a_loadable_preset(tmp_path: Path) -> None:
    """The whole pipeline on a toy budget: same seed, same weights; the preset loads and generates."""
    spec = dataclasses.replace(
        SPECS["llama3-calendar"], hidden_dim=32, num_layers=1, intermediate_dim=32, examples=120, steps=2, batch_size=4
    )
    steps: list[tuple[str, int, int]] = []
    first = train_demo_model(
        spec, tmp_path / "a", seed=5, on_step=lambda name, step, total, loss: steps.append((name, step, total))
    )
    second = train_demo_model(spec, tmp_path / "b", seed=5)
    assert steps == [(spec.name, 1, 2), (spec.name, 2, 2)]
    one, two = (keras_hub.models.CausalLM.from_preset(str(path)) for path in (first, second))
    for a, b in zip(one.backbone.weights, two.backbone.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert read_preset(first).family == "llama3"
    assert isinstance(one.generate("Hi", max_length=24), str)


def test_command_rejects_bad_arguments() -> None:
    with pytest.raises(CommandError, match="Unknown preset"):
        call_command("build_demo_models", "--only", "nope", "--out", "/nonexistent")
    with pytest.raises(CommandError, match="--eval-n"):
        call_command("build_demo_models", "--eval-n", "0", "--out", "/nonexistent")
    with pytest.raises(CommandError, match="--tiny"):
        call_command("build_demo_models", "--tiny", "--only", "gemma-calendar", "--out", "/nonexistent")


# --- Registration: the demo models sample ------------------------------------------------------------


@pytest.mark.django_db
def test_registered_demo_models_sample_and_their_replies_differ() -> None:
    """A greedy model is never drawn for an anonymous battle, so the demo models are registered
    sampling (an entry left at the old greedy defaults is given the sampling settings, an admin's
    own settings are kept), and through the engine, with a reply's settings as the worker builds
    them, one prompt to the weak demo model gets more than one reply over eight fresh seeds."""
    from inference.engine import SamplingParams
    from inference.hosts import engines
    from inference.models import DEFAULT_SAMPLING, LLM, OLD_GREEDY_DEFAULTS
    from inference.services import model_spec

    LLM.objects.create(name="gemma-calendar", family="gemma", preset="old", **OLD_GREEDY_DEFAULTS)
    LLM.objects.create(name="mistral-calendar", family="mistral", preset="old", temperature=0.3)
    call_command("register_demo_models", stdout=open(os.devnull, "w"))  # noqa: SIM115
    registered = {llm.name: llm for llm in LLM.objects.all()}
    assert set(registered) == {model.name for model in trained_models(PRESETS_DIR)}
    assert all(llm.samples for llm in registered.values())
    for name in ("gemma-calendar", "llama3-calendar"):
        llm = registered[name]
        assert {field: getattr(llm, field) for field in DEFAULT_SAMPLING} == DEFAULT_SAMPLING, name
    assert registered["mistral-calendar"].temperature == 0.3
    weak = registered[next(spec.name for spec in TRAINED_MODEL_SPECS if spec.quality == "weak")]
    engine = engines.engine_for(model_spec(weak))
    prompt = render_prompt(weak.family, None, [ChatTurn(role="user", content="Add a meeting with Fred on Nov 11")])
    requests = [
        engine.submit(
            prompt,
            max_new_tokens=16,
            stop_strings=stop_strings(weak.family),
            sampling=SamplingParams(temperature=weak.temperature, top_k=weak.top_k, top_p=weak.top_p, seed=seed),
        )
        for seed in range(8)
    ]
    replies = ["".join(request.deltas(tick=None)) for request in requests]
    assert len(set(replies)) > 1, replies
