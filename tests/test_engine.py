"""The continuous-batching engine against keras-hub's own generate(), on every bundled preset.

One engine per preset (module scope, warmed up once) serves all tests; its compiled functions are
shared with any other engine of the same model and slot count, so the extra engines here compile
nothing. Plain pytest: no database access.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras_hub
import pytest

from inference.building.demo_models import SYSTEM_PROMPT
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.engine import (
    DEFAULT_STEPS_PER_DISPATCH,
    GREEDY,
    Engine,
    EngineClosedError,
    EngineError,
    Request,
    SamplingParams,
)
from inference.engine import programs as engine_programs
from inference.engine import sampling as engine_sampling
from inference.engine import scheduler as engine_scheduler
from inference.registry import PresetInfo, local_presets
from inference.streaming import encode_prompt

PRESETS = local_presets(Path(__file__).resolve().parents[1] / "inference" / "presets")
SLOTS = 3
BUCKETS = (128,)  # Plus the context (512): two prefill shapes and two decode windows to compile.
WINDOWS = (128,)
REQUESTS = (
    "Add a meeting with Fred on Nov 11 at 5PM",
    "Cancel the meeting with Fred.",
    "Set the duration to 3 hours.",
)
NEW_TOKENS = 40  # generate()'s one max_length: the longest prompt of REQUESTS plus this.
# keras's own variable serialisation under numpy 2; not something these tests control.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")


@pytest.fixture(scope="module", params=PRESETS, ids=[p.name for p in PRESETS])
def preset(request: pytest.FixtureRequest) -> PresetInfo:
    return request.param


@pytest.fixture(scope="module")
def lm(preset: PresetInfo) -> keras_hub.models.CausalLM:
    # Our own instance (not load_causal_lm's shared one): compile() switches generate() to greedy.
    model = keras_hub.models.CausalLM.from_preset(str(preset.path))
    model.compile(sampler="greedy")
    return model


@pytest.fixture(scope="module")
def engine(lm: keras_hub.models.CausalLM) -> Iterator[Engine]:
    with Engine(lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS) as shared:
        shared.warm_up()
        yield shared


@pytest.fixture(scope="module")
def prompts(preset: PresetInfo) -> list[str]:
    return [render_prompt(preset.family, SYSTEM_PROMPT, [ChatTurn("user", r)]) for r in REQUESTS]


@pytest.fixture(scope="module")
def max_length(lm: keras_hub.models.CausalLM, prompts: list[str]) -> int:
    return max(len(encode_prompt(lm, p)) for p in prompts) + NEW_TOKENS


def generate_reply(lm: keras_hub.models.CausalLM, family: str, prompt: str, max_length: int) -> str:
    """generate()'s greedy reply, with the engine's stop tokens.

    The stop token text generate() leaves at the end (Gemma's <end_of_turn> is not a keras
    "special" token) is removed, as the engine never shows it. The Llama 3 template's leading
    <|begin_of_text|> is removed because the preprocessor adds it (the engine does the same,
    instead of doubling it).
    """
    tokenizer = lm.preprocessor.tokenizer
    stops = stop_strings(family)
    stop_ids = tuple(sorted({tokenizer.token_to_id(s) for s in stops} | {tokenizer.end_token_id}))
    start = tokenizer.start_token if lm.preprocessor.add_start_token else ""
    text = lm.generate(prompt.removeprefix(start), max_length=max_length, stop_token_ids=stop_ids, strip_prompt=True)
    for stop in stops:
        text = text.removesuffix(stop)
    return text


@pytest.fixture(scope="module")
def references(lm: keras_hub.models.CausalLM, preset: PresetInfo, prompts: list[str], max_length: int) -> list[str]:
    """generate()'s greedy replies, with one fixed max_length (one compilation) for all prompts."""
    return [generate_reply(lm, preset.family, p, max_length) for p in prompts]


def submit_greedy(engine: Engine, lm: keras_hub.models.CausalLM, family: str, prompt: str, max_length: int) -> Request:
    """A request that generates what generate(max_length=max_length) does."""
    new_tokens = max_length - len(encode_prompt(lm, prompt))
    return engine.submit(prompt, max_new_tokens=new_tokens, stop_strings=stop_strings(family))


def collect(request: Request) -> str:
    deltas = list(request)
    assert all(isinstance(d, str) and d for d in deltas)
    assert "".join(deltas) == request.text
    return request.text


def with_noise(
    preset: PresetInfo, variables: Callable[[keras_hub.models.CausalLM], list[Any]], scale: float
) -> keras_hub.models.CausalLM:
    """The preset's model, greedy, with Gaussian noise of ``scale`` times their spread added to
    the ``variables`` it picks: a model of the same architecture with other weights."""
    import keras
    import numpy as np

    model = keras_hub.models.CausalLM.from_preset(str(preset.path))
    model.compile(sampler="greedy")
    rng = np.random.default_rng(0)
    for variable in variables(model):
        values = keras.ops.convert_to_numpy(variable)
        variable.assign(values + rng.normal(0.0, scale * float(values.std()), values.shape).astype(values.dtype))
    return model


def wait_for_free_slots(engine: Engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.free_slots != engine.slots and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.free_slots == engine.slots and engine.active_slots == 0


def prompt_of_length(lm: keras_hub.models.CausalLM, family: str, minimum: int) -> str:
    """A calendar request at least ``minimum`` tokens long (just over it)."""
    text = "Add a meeting with Fred on Nov 11 at 5PM."
    prompt = render_prompt(family, None, [ChatTurn("user", text)])
    while len(encode_prompt(lm, prompt)) < minimum:
        text += " Add a meeting with Fred on Nov 11 at 5PM."
        prompt = render_prompt(family, None, [ChatTurn("user", text)])
    return prompt


# --- Greedy output equals generate() -------------------------------------------------------


def test_greedy_equals_generate_in_one_batch(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    requests = [submit_greedy(engine, lm, preset.family, p, max_length) for p in prompts]
    texts = [collect(r) for r in requests]
    assert texts == references
    for request in requests:
        assert request.stop_reason in ("stop", "length")
        assert request.stats.tokens == len(request.token_ids) <= request.max_new_tokens
        assert request.stats.ttft_s is not None and 0 < request.stats.ttft_s <= request.stats.duration_s
        assert request.stats.tokens_per_s > 0
    wait_for_free_slots(engine)


def test_a_model_of_the_same_architecture_shares_the_compiled_programs(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    """Another model in the same architecture, other weights (as a fine-tuned fixer is to its
    base): its engine compiles nothing, and decodes with its own weights, not the first's."""
    other_lm = with_noise(preset, lambda lm: lm.backbone.token_embedding.weights, scale=2)
    expected = [generate_reply(other_lm, preset.family, prompt, max_length) for prompt in prompts]
    assert expected != references  # Other weights, other replies.
    with Engine(other_lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS) as other:
        other.warm_up()
        texts = [collect(submit_greedy(other, other_lm, preset.family, p, max_length)) for p in prompts]
        assert other.compilations == 0
    assert texts == expected


def test_deltas_with_a_clock_tick_give_the_same_text_and_empty_ticks_between(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    request = submit_greedy(engine, lm, preset.family, prompts[0], max_length)
    items = list(request.deltas(tick=1e-4))  # Far shorter than a dispatch: some ticks come empty.
    assert "".join(items) == request.text == references[0]
    assert "" in items and any(items)
    wait_for_free_slots(engine)


def test_requests_joining_mid_flight_produce_their_solo_text(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    # A long reply (no stop tokens) that is certainly still running when B and C arrive.
    solo_a = engine.submit(prompts[0], max_new_tokens=300, ignore_stop_tokens=True)
    expected_a = collect(solo_a)
    assert solo_a.stats.tokens == 300

    a = engine.submit(prompts[0], max_new_tokens=300, ignore_stop_tokens=True)
    deltas = iter(a)
    first = next(deltas)
    assert not a.done
    b = submit_greedy(engine, lm, preset.family, prompts[1], max_length)
    c = submit_greedy(engine, lm, preset.family, prompts[2], max_length)
    assert first + "".join(deltas) == expected_a == a.text
    assert [collect(b), collect(c)] == references[1:]
    wait_for_free_slots(engine)


# --- Prefix cache --------------------------------------------------------------------------


def test_a_dialog_continues_from_its_cached_prefix(
    engine: Engine, lm: keras_hub.models.CausalLM, preset: PresetInfo, prompts: list[str], references: list[str]
) -> None:
    """The next turn of a dialog reuses the cached keys and values of the turn before and still
    produces exactly what generate() produces for the whole prompt."""
    turns = [ChatTurn("user", REQUESTS[0]), ChatTurn("assistant", references[0]), ChatTurn("user", REQUESTS[1])]
    follow_up = render_prompt(preset.family, SYSTEM_PROMPT, turns)
    length = len(encode_prompt(lm, follow_up))
    expected = generate_reply(lm, preset.family, follow_up, length + NEW_TOKENS)

    collect(engine.submit(prompts[0], max_new_tokens=5))  # The first turn: its prefix is cached.
    hits, reused = engine.prefix_cache.hits, engine.prefix_cache.reused_tokens
    request = submit_greedy(engine, lm, preset.family, follow_up, length + NEW_TOKENS)
    assert collect(request) == expected
    assert engine.prefix_cache.hits == hits + 1
    # At least the system prompt and the first request came from the cache.
    first_turn = len(encode_prompt(lm, prompts[0]))
    assert engine.prefix_cache.reused_tokens - reused >= first_turn - first_turn % 16 - 16
    wait_for_free_slots(engine)


def test_short_and_long_cached_prefixes_give_the_text_of_the_whole_prompt(
    lm: keras_hub.models.CausalLM, preset: PresetInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short chunk after a short cached prefix attends over the shortest of SHORT_PREFIXES
    that holds the prefix, anything else over the whole pool row: each gives what generate()
    gives for the whole prompt. The bundled models' pool rows are as short as the real models'
    short prefixes, so these are lowered."""
    monkeypatch.setattr(engine_scheduler, "SHORT_PREFIXES", (16, 48))
    first = [ChatTurn("user", REQUESTS[0])]
    dialog = [*first, ChatTurn("assistant", "Done."), ChatTurn("user", REQUESTS[2])]
    short_first, short_dialog = (render_prompt(preset.family, None, turns) for turns in (first, dialog))
    long_first, long_dialog = (render_prompt(preset.family, SYSTEM_PROMPT, turns) for turns in (first, dialog))
    with Engine(lm, slots=SLOTS, buckets=(48, *BUCKETS), windows=WINDOWS) as short_chunks:
        texts, expected = [], []
        for opening, follow_up in ((short_first, short_dialog), (long_first, long_dialog)):
            collect(short_chunks.submit(opening, max_new_tokens=5))  # Its prefix is cached.
            length = len(encode_prompt(lm, follow_up))
            texts.append(collect(submit_greedy(short_chunks, lm, preset.family, follow_up, length + NEW_TOKENS)))
            expected.append(generate_reply(lm, preset.family, follow_up, length + NEW_TOKENS))
        traces, hits = short_chunks._programs.traces, short_chunks.prefix_cache.hits
    assert texts == expected
    assert hits == 2
    # Both follow-ups are short chunks: after a 16-token prefix without the system prompt, after
    # one of over 48 tokens with it. No other engine compiles 48-token chunks.
    assert traces["prefill[48, 16]"] and traces["prefill[48, 256]"]


def test_compact_shapes_compile_fewer_programs_and_give_the_same_text(
    lm: keras_hub.models.CausalLM, preset: PresetInfo, prompts: list[str], references: list[str], max_length: int
) -> None:
    """The embedded arena's engines compile powers of two only (``compact``): fewer prefill
    lengths and decode windows than the default set, the context still among them, and the same
    greedy text."""
    with Engine(lm, slots=SLOTS) as full, Engine(lm, slots=SLOTS, compact=True) as compact:
        assert set(compact.buckets) < set(full.buckets) and set(compact.windows) < set(full.windows)
        for lengths in (compact.buckets, compact.windows):
            assert lengths[-1] == compact.context_length
            assert all(n & (n - 1) == 0 for n in lengths[:-1])  # Powers of two.
        texts = [collect(submit_greedy(compact, lm, preset.family, p, max_length)) for p in prompts]
    assert texts == references


def test_caches_kept_in_float16_hold_half_the_bytes_and_give_the_same_text(
    lm: keras_hub.models.CausalLM, preset: PresetInfo, prompts: list[str], references: list[str], max_length: int
) -> None:
    """The embedded arena's engines keep keys and values in float16 (``cache_dtype``): every
    cache of the float32 model (slots, staging row, prefix pool) holds half the bytes, and the
    bundled model's greedy text stays generate()'s."""
    assert lm.backbone.compute_dtype == "float32"
    with Engine(lm, slots=SLOTS, cache_dtype="float16") as narrow:
        texts = [collect(submit_greedy(narrow, lm, preset.family, p, max_length)) for p in prompts]
        device = narrow._device
        assert device is not None
        assert narrow.cache_dtype == "float16"
        assert {str(part.dtype) for caches in (device.cache, device.staging, device.pool) for part in caches} == {
            "float16"
        }
    assert texts == references


def test_a_key_past_float16s_range_is_kept_at_its_edge() -> None:
    """A float16 cache holds a key beyond its range as the largest it can (not infinite, which
    would make every softmax over it not a number), and the others as they are."""
    import jax.numpy as jnp

    from inference.forward.attention import cache_shapes, write_keys

    keys, _ = cache_shapes(rows=1, kv_heads=1, head_dim=2, positions=4)
    update = jnp.array([[[[1e6, -1.5]]]], jnp.float32)  # [rows, T, kv_heads, head_dim]
    written = write_keys(jnp.zeros(keys, jnp.float16), update, jnp.array([1]))
    assert written[0, 0, :, 1].tolist() == [65504.0, -1.5]


def test_a_fine_tuned_model_holds_only_the_weights_it_changed(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    """A model whose weights differ from a loaded one's in one kernel (as a LoRA fixer's differ
    from its base's in a few) shares every other variable's array, and its engine every equal
    laid-out copy; each still decodes with its own weights."""
    import jax
    import numpy as np

    from inference.engine.shared_weights import share_weights

    def first_kernel(model: keras_hub.models.CausalLM) -> list[Any]:
        return [next(w for w in model.backbone.transformer_layers[0].weights if w.path.endswith("kernel"))]

    other_lm = with_noise(preset, first_kernel, scale=4)
    [changed] = first_kernel(other_lm)
    expected = [generate_reply(other_lm, preset.family, prompt, max_length) for prompt in prompts]
    assert expected != references

    share_weights(lm)
    shared = share_weights(other_lm)
    pairs = list(zip(lm.weights, other_lm.weights, strict=True))
    assert shared == sum(mine.value.nbytes for mine, _ in pairs) - changed.value.nbytes
    assert [theirs.value is mine.value for mine, theirs in pairs] == [theirs is not changed for _, theirs in pairs]
    with Engine(other_lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS) as other:
        texts = [collect(submit_greedy(other, other_lm, preset.family, p, max_length)) for p in prompts]
        mine, theirs = (jax.tree_util.tree_leaves(e._device.weights) for e in (engine, other))
        equal = [np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True)]
        assert [a is b for a, b in zip(mine, theirs, strict=True)] == equal
        assert engine.forward_layout != "feature-major" or not all(equal)  # The changed kernel's copy.
    assert texts == expected
    assert [collect(submit_greedy(engine, lm, preset.family, p, max_length)) for p in prompts] == references


@pytest.mark.parametrize("layout", ["token-major", "feature-major"])
def test_both_llama_layouts_give_the_text_of_generate(
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
    layout: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Llama pass runs whichever layout multiplies faster here: each gives generate()'s
    text, so the machine's choice never changes what a model says. An engine with compact
    shapes (the embedded arena's) keeps the kernels as they lie, whichever is faster."""
    from inference.forward import llama

    if not isinstance(lm, (keras_hub.models.Llama3CausalLM, keras_hub.models.MistralCausalLM)):
        pytest.skip("Only the Llama pass has two layouts.")
    monkeypatch.setattr(llama, "faster_layout", lambda model: layout)
    monkeypatch.setattr(engine_programs, "_programs", type(engine_programs._programs)())  # Built afresh.
    with Engine(lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS) as laid_out:
        assert laid_out.forward_layout == layout
        texts = [collect(submit_greedy(laid_out, lm, preset.family, p, max_length)) for p in prompts]
    assert texts == references
    with Engine(lm, slots=SLOTS, compact=True) as compact:
        assert compact.forward_layout == "token-major"


def test_without_a_prefix_cache_the_text_is_the_same(
    lm: keras_hub.models.CausalLM, preset: PresetInfo, prompts: list[str], references: list[str], max_length: int
) -> None:
    with Engine(lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS, prefix_cache_rows=0) as uncached:
        texts = [collect(submit_greedy(uncached, lm, preset.family, p, max_length)) for p in prompts]
        assert uncached.prefix_cache.hits == 0
    assert texts == references


def test_more_requests_than_slots_all_complete(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    count = 2 * SLOTS + 1
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            request = submit_greedy(engine, lm, preset.family, prompts[index % len(prompts)], max_length)
            results[index] = collect(request)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert results == {i: references[i % len(prompts)] for i in range(count)}
    wait_for_free_slots(engine)


# --- Limits, cancellation, invalid requests ------------------------------------------------


def test_length_limit_and_context_end(engine: Engine, lm: keras_hub.models.CausalLM, preset: PresetInfo) -> None:
    short = engine.submit(prompt_of_length(lm, preset.family, 150), max_new_tokens=5, ignore_stop_tokens=True)
    collect(short)
    assert short.stop_reason == "length" and short.stats.tokens == 5

    # A prompt near the end of the context: the reply is capped by the context, not the request.
    prompt = prompt_of_length(lm, preset.family, engine.context_length - 40)
    room = engine.context_length - len(encode_prompt(lm, prompt))
    assert 0 < room <= 40
    capped = engine.submit(prompt, max_new_tokens=400, ignore_stop_tokens=True)
    collect(capped)
    assert capped.max_new_tokens == room
    assert capped.stop_reason == "length" and capped.stats.tokens == room
    wait_for_free_slots(engine)


def test_cancel_frees_the_slot(engine: Engine, prompts: list[str]) -> None:
    request = engine.submit(prompts[0], max_new_tokens=300, ignore_stop_tokens=True)
    deltas = iter(request)
    next(deltas)
    request.cancel()
    list(deltas)
    assert request.stop_reason == "cancelled"
    assert request.stats.tokens < 300
    wait_for_free_slots(engine)


def test_cancel_a_queued_request(engine: Engine, prompts: list[str]) -> None:
    running = [engine.submit(prompts[0], max_new_tokens=300, ignore_stop_tokens=True) for _ in range(SLOTS)]
    for request in running:
        next(iter(request))  # Each has a slot and is producing text.
    queued = engine.submit(prompts[1], max_new_tokens=10)
    assert engine.free_slots == 0 and not queued.done
    queued.cancel()
    assert list(queued) == [] and queued.stop_reason == "cancelled" and queued.stats.tokens == 0
    for request in running:
        request.cancel()
        list(request)
        assert request.stop_reason == "cancelled"
    wait_for_free_slots(engine)
    assert engine.queued == 0


@pytest.mark.parametrize(
    ("prompt", "kwargs", "message"),
    [
        ("", {}, "empty"),
        ("  \n", {}, "empty"),
        ("Hi", {"max_new_tokens": 0}, "max_new_tokens"),
        ("Hi", {"stop_strings": [""]}, "Stop strings must be non-empty"),
        ("Hi", {"stop_strings": "</s>"}, "sequence"),
        ("Hi", {"sampling": "greedy"}, "SamplingParams"),
        ("Add a meeting with Fred on Nov 11 at 5PM. " * 200, {}, "context is 512 tokens"),
    ],
)
def test_invalid_requests_raise_and_take_no_slot(
    engine: Engine, prompt: str, kwargs: dict[str, object], message: str
) -> None:
    arguments: dict[str, object] = {"max_new_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt, **arguments)  # type: ignore[arg-type]
    assert engine.free_slots == engine.slots and engine.queued == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_submit_after_shutdown(lm: keras_hub.models.CausalLM, engine: Engine, prompts: list[str]) -> None:
    # Same model and slot count as the shared engine: same compiled functions, nothing compiles.
    other = Engine(lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS)
    compilations = other.compilations
    with other:
        running = other.submit(prompts[0], max_new_tokens=300, ignore_stop_tokens=True)
        next(iter(running))
    # Leaving the block shut the engine down: the running request ended, new ones are refused.
    list(running)
    assert running.stop_reason == "cancelled"
    with pytest.raises(EngineClosedError, match="shut down"):
        other.submit(prompts[0], max_new_tokens=8)
    assert other.compilations == compilations
    other.shutdown()  # Idempotent.


# --- Sampling ------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible(engine: Engine, prompts: list[str]) -> None:
    def sample(sampling: SamplingParams, count: int = 1) -> list[str]:
        requests = [
            engine.submit(prompts[0], max_new_tokens=30, ignore_stop_tokens=True, sampling=sampling)
            for _ in range(count)
        ]
        return [collect(r) for r in requests]

    # A hot temperature: the trained models are so sure of a calendar call that at 1.0 two
    # seeds can draw the same 30 tokens.
    params = SamplingParams(temperature=3.0, top_k=50, top_p=0.95, seed=7)
    together = sample(params, count=2)  # Same batch, different slots.
    assert together[0] == together[1] == sample(params)[0]  # And again later, alone.
    others = sample(SamplingParams(temperature=3.0, top_k=50, top_p=0.95, seed=8)) + sample(
        SamplingParams(temperature=3.0, seed=9)
    )
    assert any(text != together[0] for text in others)

    greedy = sample(GREEDY)[0]
    assert sample(SamplingParams(temperature=5.0, seed=3))[0] != greedy
    # Filters that leave one candidate are greedy whatever the temperature and seed.
    assert sample(SamplingParams(temperature=2.0, top_k=1, seed=5))[0] == greedy
    assert sample(SamplingParams(temperature=2.0, top_p=1e-6, seed=6))[0] == greedy
    wait_for_free_slots(engine)


def test_mixed_sampling_in_one_batch_keeps_greedy_exact(
    engine: Engine,
    lm: keras_hub.models.CausalLM,
    preset: PresetInfo,
    prompts: list[str],
    references: list[str],
    max_length: int,
) -> None:
    hot = engine.submit(prompts[1], max_new_tokens=60, sampling=SamplingParams(temperature=1.5, seed=1))
    greedy = submit_greedy(engine, lm, preset.family, prompts[0], max_length)
    assert collect(greedy) == references[0]
    collect(hot)
    wait_for_free_slots(engine)


def test_greedy_tokens_are_the_greedy_samplers_in_clear_rows_and_near_ties() -> None:
    """The engine's greedy token skips the softmax where a row's largest logit stands clear of
    the others; where two logits are within the margin it takes GreedySampler's own float32
    softmax and argmax, which can tie two different logits (their probabilities round equal)
    and then picks the first: not the largest logit's index."""
    import jax
    import numpy as np
    from keras import ops

    vocabulary = 1000
    rng = np.random.default_rng(0)
    clear = (rng.standard_normal((4, vocabulary)) * 4).astype(np.float32)
    exact_tie = clear[1].copy()
    exact_tie[[10, 20]] = 50.0  # The first index.
    near_tie = np.full(vocabulary, -5.0, np.float32)
    near_tie[30] = 0.01  # One float32 step below the largest logit: equal probabilities.
    near_tie[31] = np.nextafter(np.float32(0.01), np.float32(1.0))
    apart = clear[1].copy()
    apart[[40, 41]] = 30.0, 30.0 + 5e-4  # Within the margin, but the softmax tells them apart.

    sampler = keras_hub.samplers.GreedySampler()
    temperature, top_k, top_p = np.zeros(4, np.float32), np.zeros(4, np.int32), np.ones(4, np.float32)  # Greedy.
    draw = jax.jit(lambda logits, keys: engine_sampling.sample_tokens(logits, temperature, top_k, top_p, keys, sampler))
    keys = np.zeros((4, 2), np.uint32)
    for row, expected_token in ((None, None), (exact_tie, 10), (near_tie, 30), (apart, 41)):
        logits = clear.copy()
        if row is not None:
            logits[1] = row  # One row near a tie, the others clear.
        tokens = np.asarray(draw(logits, keys)[0]).tolist()
        expected = ops.convert_to_numpy(sampler.get_next_token(sampler.compute_probabilities(logits))).tolist()
        assert tokens == expected
        if expected_token is not None:
            assert tokens[1] == expected_token
    assert int(np.argmax(near_tie)) == 31  # The softmax's tie, not the largest logit.


def kept_distribution(logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The distribution a sampling step draws from, computed directly (NumPy, float64): the
    logits over the temperature, the top-k, then the smallest prefix of them, most likely
    first, whose probability reaches top-p (over the top-k, or the whole vocabulary)."""
    import numpy as np

    scaled = np.asarray(logits, np.float64) / temperature
    descending = np.sort(scaled)[::-1]
    kept_k = top_k if 0 < top_k < scaled.size else scaled.size
    top = descending[:kept_k]
    probabilities = np.exp(top - top[0]) / np.exp(top - top[0]).sum()
    before = np.cumsum(probabilities) - probabilities
    last = int(np.sum((before < top_p) | (top_p >= 1.0))) - 1
    weights = np.where(scaled >= top[max(last, 0)], np.exp(scaled - top[0]), 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize("candidates", [engine_sampling.SAMPLING_CANDIDATES, ()], ids=["candidates", "sorted"])
@pytest.mark.parametrize(
    ("shape", "temperature", "top_k", "top_p"),
    [
        ("peaked", 0.7, 0, 0.95),  # A few tokens hold the mass: among the first candidates.
        ("peaked", 1.0, 3, 1.0),  # The top-k alone.
        ("spread", 0.7, 0, 0.9),  # Hundreds of tokens kept: among the second candidates.
        ("flat", 1.0, 0, 0.95),  # Nearly the whole vocabulary kept: sorted.
    ],
)
def test_sampling_draws_from_the_top_k_and_top_p_tokens_in_their_proportions(
    candidates: tuple[int, ...],
    shape: str,
    temperature: float,
    top_k: int,
    top_p: float,
) -> None:
    """A sampling step's tokens are the kept ones (top-k, then top-p) in their softmax
    proportions, whether the kept tokens lie among the most likely candidates or need the whole
    vocabulary sorted (``()``: always sorted). Thousands of draws of one row, each with its own
    key, against the distribution computed directly."""
    import jax
    import numpy as np

    vocabulary, draws = 6000, 3000
    rng = np.random.default_rng(1)
    logits = {
        "peaked": np.concatenate([[12.0, 11.5, 11.0, 10.0], rng.standard_normal(vocabulary - 4)]),
        "spread": np.concatenate([3.0 + rng.standard_normal(800) * 0.3, rng.standard_normal(vocabulary - 800) - 4]),
        "flat": rng.standard_normal(vocabulary) * 0.1,
    }[shape].astype(np.float32)
    rng.shuffle(logits)
    expected = kept_distribution(logits, temperature, top_k, top_p)
    rows = np.broadcast_to(logits, (draws, vocabulary))
    keys = np.stack([np.zeros(draws, np.uint32), np.arange(draws, dtype=np.uint32)], axis=1)
    parameters = (
        np.full(draws, temperature, np.float32),
        np.full(draws, top_k, np.int32),
        np.full(draws, top_p, np.float32),
    )
    sampler = keras_hub.samplers.GreedySampler()
    draw = jax.jit(
        lambda logits, keys: engine_sampling.sample_tokens(logits, *parameters, keys, sampler, candidates)[0]
    )
    tokens = np.asarray(draw(rows, keys))
    kept = expected > 0
    assert kept[tokens].all()  # Never a token top-k or top-p leaves out.
    if kept.sum() <= 1000:  # Frequencies: total variation distance within sampling noise.
        observed = np.bincount(tokens, minlength=vocabulary) / draws
        noise = np.sqrt(kept.sum() / draws)
        assert 0.5 * np.abs(observed - expected).sum() < 0.6 * noise + 0.02
    else:  # Most of the vocabulary: draws spread over it, hardly ever twice the same.
        assert len(set(tokens.tolist())) > 0.6 * draws


# --- Dispatch size and windows -------------------------------------------------------------


def test_a_tiny_model_dispatches_the_most_steps(engine: Engine, prompts: list[str]) -> None:
    """The demo models' steps take well under a millisecond: measured, they keep the largest
    dispatch (the host's work per dispatch would otherwise dominate)."""
    collect(engine.submit(prompts[0], max_new_tokens=40, ignore_stop_tokens=True))
    assert engine.steps_per_dispatch == engine.max_steps_per_dispatch == DEFAULT_STEPS_PER_DISPATCH


def test_fixed_steps_per_dispatch_give_the_same_text(
    lm: keras_hub.models.CausalLM, engine: Engine, preset: PresetInfo, prompts: list[str], max_length: int
) -> None:
    """A fixed dispatch size (its own compiled programs) decodes the same greedy text, and
    stays fixed."""
    expected = [collect(submit_greedy(engine, lm, preset.family, p, max_length)) for p in prompts]
    with Engine(lm, slots=SLOTS, buckets=BUCKETS, windows=WINDOWS, steps_per_dispatch=3) as fixed:
        requests = [submit_greedy(fixed, lm, preset.family, p, max_length) for p in prompts]
        assert [collect(r) for r in requests] == expected
        assert fixed.steps_per_dispatch == fixed.max_steps_per_dispatch == 3


def wait_for_the_smallest_window(engine: Engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine._window != engine.windows[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine._window == engine.windows[0]


def test_the_caches_shrink_back_and_keep_running_requests(
    lm: keras_hub.models.CausalLM, engine: Engine, preset: PresetInfo, prompts: list[str]
) -> None:
    """A long request takes the slot caches to the context's window; once the engine is idle
    again they are back at the smallest window (their memory handed back to the system), and a
    short request then gives the text it gives alone."""
    long_prompt = prompt_of_length(lm, preset.family, 200)
    short_prompt = render_prompt(preset.family, None, [ChatTurn("user", REQUESTS[1])])
    assert len(encode_prompt(lm, short_prompt)) + 20 + DEFAULT_STEPS_PER_DISPATCH <= WINDOWS[0]
    alone = collect(engine.submit(short_prompt, max_new_tokens=20, ignore_stop_tokens=True))
    wait_for_the_smallest_window(engine)
    deltas = iter(engine.submit(long_prompt, max_new_tokens=60, ignore_stop_tokens=True))
    next(deltas)  # Its first text: the caches hold its positions.
    assert engine._window == engine.context_length
    list(deltas)
    wait_for_the_smallest_window(engine)
    assert collect(engine.submit(short_prompt, max_new_tokens=20, ignore_stop_tokens=True)) == alone
    wait_for_the_smallest_window(engine)


# --- Compilations --------------------------------------------------------------------------


def test_no_compilation_after_warm_up(engine: Engine, lm: keras_hub.models.CausalLM, preset: PresetInfo) -> None:
    assert engine.compilations > 0  # Warm-up's, counted.
    compilations = engine.compilations
    short = render_prompt(preset.family, None, [ChatTurn("user", "Hi")])
    medium = render_prompt(preset.family, SYSTEM_PROMPT, [ChatTurn("user", REQUESTS[0])])
    longer = prompt_of_length(lm, preset.family, 200)
    lengths = {len(encode_prompt(lm, p)) for p in (short, medium, longer)}
    assert min(lengths) < BUCKETS[0] < max(lengths), lengths  # Both prefill shapes are used.
    requests = [
        engine.submit(short, max_new_tokens=20),
        engine.submit(medium, max_new_tokens=150, ignore_stop_tokens=True),  # Crosses windows.
        engine.submit(longer, max_new_tokens=20, sampling=SamplingParams(temperature=0.8, top_k=5, seed=2)),
        engine.submit(short, max_new_tokens=20, sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=3)),
    ]
    for request in requests:
        collect(request)
    assert engine.compilations == compilations


def test_timing_decode_steps_compiles_nothing_and_leaves_requests_alone(engine: Engine, prompts: list[str]) -> None:
    """``decode_step_seconds`` (the benchmark's busy-step figure) runs dummy steps of every slot
    on the idle engine at compiled windows only, and a request afterwards decodes as before."""
    before = collect(engine.submit(prompts[0], max_new_tokens=24, ignore_stop_tokens=True))
    compilations = engine.compilations
    for window in (1, WINDOWS[0] + 1):  # The smallest window, then the context's.
        assert engine.decode_step_seconds(window, seconds=0.05) > 0
    assert engine.compilations == compilations
    assert engine._window == WINDOWS[0]
    assert collect(engine.submit(prompts[0], max_new_tokens=24, ignore_stop_tokens=True)) == before
    with pytest.raises(ValueError, match="positive"):
        engine.decode_step_seconds(0)


# --- Failures ------------------------------------------------------------------------------


def test_decode_failure_ends_requests_with_an_error(
    engine: Engine, prompts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    programs = engine._programs
    original = programs.generate
    failures = 0

    def fail_once(*args: object) -> object:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("simulated device failure")
        return original(*args)

    monkeypatch.setattr(programs, "generate", fail_once)
    doomed = engine.submit(prompts[0], max_new_tokens=20)
    with pytest.raises(EngineError, match="simulated device failure"):
        list(doomed)
    assert doomed.stop_reason == "error" and isinstance(doomed.error, RuntimeError)
    wait_for_free_slots(engine)

    # The engine recovered: fresh buffers, and the next request is served normally.
    fine = engine.submit(prompts[0], max_new_tokens=5, ignore_stop_tokens=True)
    collect(fine)
    assert fine.stop_reason == "length" and fine.stats.tokens == 5
