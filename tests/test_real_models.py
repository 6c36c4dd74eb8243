"""Real pretrained LLMs through the continuous-batching engine: SmolLM2-135M-Instruct (Llama 3
backbone, ChatML) and Gemma 3 270M (base; query/key norms, sliding-window layers), imported from
their registry packages by the session fixtures in conftest.

For each family: the engine's greedy tokens equal keras-hub's own compiled generate loop on the
same prompt tokens, and a request that joins a running batch gets the text it gets alone.
keras-hub's ``generate()`` on strings always adds the start token (its generate_preprocess
ignores ``add_start_token``), and SmolLM2 takes none, so the reference runs keras-hub's
generate function on the prompt's token ids, which is what ``generate()`` does after
tokenizing.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.engine import GREEDY, Engine
from inference.registry import read_preset
from inference.streaming import encode_prompt

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
NEW_TOKENS = 20
CONTEXT = 256  # Of the test engines: fewer shapes to compile than the models' 2048.
SYSTEM = "You are a helpful assistant."
QUESTIONS = ("What is the capital of France?", "Name three colours.")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_lm(request: pytest.FixtureRequest) -> tuple[Any, str]:
    import keras_hub

    import inference.tokenizers  # noqa: F401

    preset: Path = request.getfixturevalue(f"{request.param}_preset")
    lm = keras_hub.models.CausalLM.from_preset(str(preset))
    lm.compile(sampler="greedy")
    lm.preprocessor.sequence_length = CONTEXT
    return lm, read_preset(preset).family


@pytest.fixture(scope="module")
def engine(real_lm: tuple[Any, str]) -> Iterator[Engine]:
    with Engine(real_lm[0], slots=2, buckets=(64,), windows=(128,)) as shared:
        shared.warm_up()
        yield shared


def reference_ids(lm: Any, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """keras-hub's compiled greedy generate loop on ``prompt_ids``, run to ``new_tokens``."""
    length = len(prompt_ids) + new_tokens
    inputs = {
        "token_ids": np.asarray([prompt_ids + [0] * new_tokens], np.int32),
        "padding_mask": np.asarray([[True] * len(prompt_ids) + [False] * new_tokens]),
    }
    out = lm.make_generate_function()(inputs, stop_token_ids=None)
    assert np.asarray(out["token_ids"]).shape[1] == length
    return [int(i) for i in np.asarray(out["token_ids"])[0, len(prompt_ids) :]]


def test_engine_uses_the_in_place_forward_pass(engine: Engine) -> None:
    assert engine.in_place


def test_a_real_model_dispatches_few_steps_at_a_time(real_lm: tuple[Any, str], engine: Engine) -> None:
    """A real model's decode step takes tens of milliseconds on a CPU: the engine measures it
    and runs the fewest steps per dispatch that last its target, so a new request's prefill
    never waits behind eight of them."""
    _, family = real_lm
    prompt = render_prompt(family, SYSTEM, [ChatTurn("user", QUESTIONS[0])])
    engine.submit(prompt, max_new_tokens=24, sampling=GREEDY, ignore_stop_tokens=True).result(120)
    assert engine.steps_per_dispatch < engine.max_steps_per_dispatch


@pytest.mark.parametrize("question", QUESTIONS)
def test_streamed_greedy_tokens_equal_keras_hub_generate(
    real_lm: tuple[Any, str], engine: Engine, question: str
) -> None:
    lm, family = real_lm
    prompt = render_prompt(family, SYSTEM, [ChatTurn("user", question)])
    request = engine.submit(prompt, max_new_tokens=NEW_TOKENS, sampling=GREEDY, ignore_stop_tokens=True)
    streamed = "".join(request)
    assert request.token_ids == reference_ids(lm, encode_prompt(lm, prompt), NEW_TOKENS)
    assert streamed.strip()


def test_a_request_joining_mid_flight_gets_the_text_it_gets_alone(real_lm: tuple[Any, str], engine: Engine) -> None:
    _, family = real_lm
    first, second = (render_prompt(family, SYSTEM, [ChatTurn("user", q)]) for q in QUESTIONS)
    stops = stop_strings(family)
    alone = engine.submit(second, max_new_tokens=NEW_TOKENS, stop_strings=stops, sampling=GREEDY).result(120)
    running = engine.submit(first, max_new_tokens=60, sampling=GREEDY, ignore_stop_tokens=True)
    deltas = iter(running)
    next(deltas)  # The first request is decoding.
    joined = engine.submit(second, max_new_tokens=NEW_TOKENS, stop_strings=stops, sampling=GREEDY)
    assert joined.result(120) == alone
    rest = list(deltas)
    assert rest, "the first request was still running when the second joined"
    assert engine.peak_active_slots == 2


def test_sampled_replies_differ_by_seed(real_lm: tuple[Any, str], engine: Engine) -> None:
    """The roster's default for real models (temperature 0.7, top-p 0.95, a seed per reply):
    Regenerate gives a new reply, while one seed gives one reply."""
    from inference.engine import SamplingParams

    _, family = real_lm
    prompt = render_prompt(family, SYSTEM, [ChatTurn("user", "Tell me about the sea.")])

    def reply(seed: int) -> str:
        sampling = SamplingParams(temperature=0.7, top_p=0.95, seed=seed)
        return engine.submit(prompt, max_new_tokens=24, sampling=sampling, ignore_stop_tokens=True).result(120)

    texts = [reply(seed) for seed in (1, 2, 3)]
    assert len(set(texts)) > 1, texts
    assert reply(2) == texts[1]
