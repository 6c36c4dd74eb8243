"""The streaming decoder against keras-hub's own generate(), on the bundled demo architectures.

The demo presets are built here into a temporary folder (a few seconds), which also checks the
builder: the tests never depend on what happens to be in inference/presets.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras_hub
import numpy as np
import pytest

from inference import streaming
from inference.building.demo_models import (
    SYSTEM_PROMPT,
    TINY_SEQUENCE_LENGTH,
    build_tiny_models,
    iter_preset_files,
    tiny_models,
)
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.streaming import (
    StreamingGeneration,
    bucket_length,
    encode_prompt,
    load_causal_lm,
    stream_generate,
    warm_up,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("gemma", "llama3")
PRESET_NAMES = {"gemma": "tiny-gemma", "llama3": "tiny-llama3"}
CAUSAL_LM_CLASSES = {"gemma": keras_hub.models.GemmaCausalLM, "llama3": keras_hub.models.Llama3CausalLM}
REQUESTS = (
    "Add a meeting with Fred on Nov 11 at 5PM",
    "Cancel the meeting with Fred.",
)
MAX_NEW_TOKENS = 40
# keras's own optimizer/variable serialisation under numpy 2; not something these tests control.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
TEMPLATE_MARKERS = {
    "gemma": ("\n", "<start_of_turn>", "<end_of_turn>"),
    "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"),
}


@pytest.fixture(scope="module")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("presets")
    written = build_tiny_models(out, seed=0)
    assert written == [out / PRESET_NAMES[f] for f in FAMILIES]
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def lm(presets_dir: Path, family: str) -> keras_hub.models.CausalLM:
    model = load_causal_lm(str(presets_dir / PRESET_NAMES[family]))
    model.compile(sampler="greedy")
    return model


def prompt_for(family: str, request: str, system: str | None = SYSTEM_PROMPT) -> str:
    return render_prompt(family, system, [ChatTurn("user", request)])


def generate_reference(model: keras_hub.models.CausalLM, family: str, prompt: str, max_new_tokens: int) -> str:
    """What keras-hub's compiled greedy generate() produces for the same request.

    Same stop tokens as the stream; the stop token text generate() leaves at the end (Gemma's
    <end_of_turn> is not a keras "special" token) is removed, as the stream never shows it. The
    Llama 3 template's leading <|begin_of_text|> is removed because the preprocessor adds it
    (the stream does the same, instead of doubling it).
    """
    tokenizer = model.preprocessor.tokenizer
    stop_ids = tuple(sorted({tokenizer.token_to_id(s) for s in stop_strings(family)} | {tokenizer.end_token_id}))
    length = len(encode_prompt(model, prompt)) + max_new_tokens
    text = model.generate(
        prompt.removeprefix("<|begin_of_text|>"), max_length=length, stop_token_ids=stop_ids, strip_prompt=True
    )
    for stop in stop_strings(family):
        text = text.removesuffix(stop)
    return text


# --- The builder and its presets -----------------------------------------------------------


def test_presets_are_small_and_complete(presets_dir: Path) -> None:
    for model in tiny_models(presets_dir):
        files = {p.relative_to(model.directory).as_posix() for p in iter_preset_files(model.directory)}
        assert {"config.json", "metadata.json", "model.weights.h5", "preprocessor.json", "task.json"} <= files
        assert any(f.startswith("assets/tokenizer/") for f in files)
        size = sum(p.stat().st_size for p in iter_preset_files(model.directory))
        assert size < 3_000_000, f"{model.name} is {size} bytes"


def test_demo_model_descriptions(presets_dir: Path) -> None:
    described = tiny_models(presets_dir)
    assert [(m.name, m.family) for m in described] == [("tiny-gemma", "gemma"), ("tiny-llama3", "llama3")]
    assert all(m.directory.is_dir() and m.description for m in described)


def test_loads_as_the_right_causal_lm(lm: keras_hub.models.CausalLM, family: str) -> None:
    assert isinstance(lm, CAUSAL_LM_CLASSES[family])
    assert lm.preprocessor.sequence_length == TINY_SEQUENCE_LENGTH


def test_tokenizer_round_trips_newlines_spaces_and_markers(lm: keras_hub.models.CausalLM, family: str) -> None:
    tokenizer = lm.preprocessor.tokenizer
    text = prompt_for(family, "Line one\n\nline  two\twith  spaces \u00e9t\u00e9 \U0001f600\n") + 'action.x("a")\n'
    ids = np.asarray(tokenizer(text)).tolist()
    assert tokenizer.detokenize(ids) == text
    for marker in TEMPLATE_MARKERS[family]:
        assert np.asarray(tokenizer(marker)).tolist() == [tokenizer.token_to_id(marker)], marker
    for stop in stop_strings(family):
        assert streaming._single_token_id(tokenizer, stop) == tokenizer.token_to_id(stop), stop


def test_builder_is_deterministic(presets_dir: Path, tmp_path: Path) -> None:
    build_tiny_models(tmp_path, seed=0)
    for name in PRESET_NAMES.values():
        for path in iter_preset_files(presets_dir / name):
            other = tmp_path / name / path.relative_to(presets_dir / name)
            if path.name == "model.weights.h5":  # Same arrays; HDF5 bytes may differ.
                assert read_weights(path).keys() == read_weights(other).keys()
                for key, value in read_weights(path).items():
                    np.testing.assert_array_equal(value, read_weights(other)[key])
            elif path.name != "metadata.json":  # It records the time of saving.
                assert path.read_bytes() == other.read_bytes(), path


def read_weights(path: Path) -> dict[str, np.ndarray]:
    import h5py

    arrays: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as weights:
        weights.visititems(lambda key, item: arrays.update({key: item[()]}) if isinstance(item, h5py.Dataset) else None)
    return arrays


# --- Streaming equals generate() -----------------------------------------------------------


@pytest.mark.parametrize("request_text", REQUESTS)
def test_stream_equals_greedy_generate(lm: keras_hub.models.CausalLM, family: str, request_text: str) -> None:
    prompt = prompt_for(family, request_text)
    generation = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS, stop_strings=stop_strings(family))
    deltas = list(generation)

    assert all(isinstance(d, str) and d for d in deltas)
    assert "".join(deltas) == generation.text == generate_reference(lm, family, prompt, MAX_NEW_TOKENS)
    assert generation.stop_reason in ("stop", "length")
    assert generation.stats.tokens == len(generation.token_ids) <= MAX_NEW_TOKENS
    assert generation.stats.ttft_s is not None and 0 < generation.stats.ttft_s <= generation.stats.duration_s
    assert generation.stats.tokens_per_s > 0


def test_prompt_has_one_start_token(lm: keras_hub.models.CausalLM, family: str) -> None:
    tokenizer = lm.preprocessor.tokenizer
    ids = encode_prompt(lm, prompt_for(family, "Hi"))
    assert ids[0] == tokenizer.start_token_id
    assert ids.count(tokenizer.start_token_id) == 1


def test_stops_on_a_stop_token_which_is_not_shown(lm: keras_hub.models.CausalLM, family: str) -> None:
    prompt = prompt_for(family, REQUESTS[0])
    full = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS)
    list(full)
    tokenizer = lm.preprocessor.tokenizer
    # Pretend the first new, non-special token from position 3 on is a stop token.
    special = set(tokenizer.special_token_ids)
    index = next(
        i for i in range(3, len(full.token_ids)) if full.token_ids[i] not in full.token_ids[:i] + list(special)
    )
    stop = tokenizer.id_to_token(full.token_ids[index])

    stopped = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS, stop_strings=[stop])
    text = "".join(stopped)
    assert stopped.stop_reason == "stop"
    assert stopped.token_ids == full.token_ids[:index]
    assert text == tokenizer.detokenize([i for i in full.token_ids[:index] if i not in special])


def test_stops_on_a_multi_token_stop_string(lm: keras_hub.models.CausalLM, family: str) -> None:
    prompt = prompt_for(family, REQUESTS[1])
    full = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS)
    text = "".join(full)
    tokenizer = lm.preprocessor.tokenizer
    position, stop = next(
        (p, text[p : p + 4])
        for p in range(2, len(text) - 4)
        if text.find(text[p : p + 4]) == p
        and "\ufffd" not in text[p : p + 4]
        and len(np.asarray(tokenizer(text[p : p + 4])).reshape(-1)) > 1
    )
    stopped = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS, stop_strings=[stop])
    deltas = list(stopped)
    assert stopped.stop_reason == "stop"
    assert "".join(deltas) == text[:position]
    assert all(deltas)


def test_cancellation_stops_early(lm: keras_hub.models.CausalLM, family: str) -> None:
    polls = 0

    def should_cancel() -> bool:
        nonlocal polls
        polls += 1
        return polls > 3  # Three tokens, then cancelled.

    prompt = prompt_for(family, REQUESTS[0])
    generation = stream_generate(lm, prompt, max_new_tokens=MAX_NEW_TOKENS, should_cancel=should_cancel)
    text = "".join(generation)
    assert generation.stop_reason == "cancelled"
    assert generation.stats.tokens == 3
    assert text == lm.preprocessor.tokenizer.detokenize(generation.token_ids)


def test_cancelled_before_the_first_token(lm: keras_hub.models.CausalLM, family: str) -> None:
    generation = stream_generate(lm, prompt_for(family, "Hi"), max_new_tokens=8, should_cancel=lambda: True)
    assert list(generation) == []
    assert generation.stop_reason == "cancelled"
    assert generation.stats.tokens == 0 and generation.stats.ttft_s is None


def test_close_cancels(lm: keras_hub.models.CausalLM, family: str) -> None:
    generation = stream_generate(lm, prompt_for(family, REQUESTS[0]), max_new_tokens=MAX_NEW_TOKENS)
    next(generation)
    generation.close()
    list(generation)
    assert generation.stop_reason == "cancelled"
    assert generation.stats.tokens < MAX_NEW_TOKENS


def test_length_limit(lm: keras_hub.models.CausalLM, family: str) -> None:
    generation = stream_generate(lm, prompt_for(family, REQUESTS[0]), max_new_tokens=5)
    list(generation)
    assert generation.stop_reason == "length"
    assert generation.stats.tokens == 5


def test_context_caps_the_reply(lm: keras_hub.models.CausalLM, family: str) -> None:
    prompt = prompt_for(family, "Add a meeting with Fred on Nov 11 at 5PM. " * 120, system=None)
    prompt_tokens = len(encode_prompt(lm, prompt))
    assert TINY_SEQUENCE_LENGTH - 1000 < prompt_tokens < TINY_SEQUENCE_LENGTH - 50
    generation = stream_generate(lm, prompt, max_new_tokens=1000)
    assert generation.padded_length == TINY_SEQUENCE_LENGTH
    assert generation.max_new_tokens == TINY_SEQUENCE_LENGTH - prompt_tokens


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_empty_prompt(lm: keras_hub.models.CausalLM, prompt: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        stream_generate(lm, prompt, max_new_tokens=8)


def test_prompt_too_long(lm: keras_hub.models.CausalLM, family: str) -> None:
    prompt = prompt_for(family, "Add a meeting with Fred on Nov 11 at 5PM. " * 800)
    with pytest.raises(ValueError, match=f"context is {TINY_SEQUENCE_LENGTH} tokens"):
        stream_generate(lm, prompt, max_new_tokens=8)


def test_max_new_tokens_must_be_positive(lm: keras_hub.models.CausalLM, family: str) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        stream_generate(lm, prompt_for(family, "Hi"), max_new_tokens=0)


# --- Incremental detokenisation, on scripted token ids -------------------------------------


class ScriptedDecoder:
    """Stands in for the compiled model: returns fixed token ids, one per call."""

    def __init__(self, ids: list[int]) -> None:
        self.ids: Iterator[int] = iter(ids)

    def prefill(self, state: Any, token_ids: Any, length: Any) -> tuple[np.ndarray, None]:
        return np.array([[next(self.ids)]], dtype=np.int32), None

    def step(self, state: Any, token: Any, cache: Any, index: Any) -> tuple[np.ndarray, None]:
        return self.prefill(state, token, index)


def test_incomplete_utf8_is_held_back(presets_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_causal_lm(str(presets_dir / "tiny-gemma"))
    tokenizer = model.preprocessor.tokenizer
    # "é" is two byte-fallback tokens; the first alone decodes to U+FFFD.
    ids = [tokenizer.token_to_id("A"), tokenizer.token_to_id("<0xC3>"), tokenizer.token_to_id("<0xA9>")]
    ids += [tokenizer.token_to_id("B"), tokenizer.token_to_id("<0xC3>"), tokenizer.token_to_id("<end_of_turn>")]
    assert tokenizer.detokenize(ids[:2]) == "A\ufffd"
    monkeypatch.setattr(streaming, "_decoder", lambda lm: ScriptedDecoder(ids))

    generation = stream_generate(model, "Hi", max_new_tokens=10, stop_strings=["<end_of_turn>"])
    deltas = list(generation)
    # The dangling byte at the end is flushed as U+FFFD, as generate() would return it.
    assert deltas == ["A", "\u00e9", "B", "\ufffd"]
    assert generation.stop_reason == "stop"
    assert generation.stats.tokens == 5


def test_partial_stop_string_is_held_back(presets_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_causal_lm(str(presets_dir / "tiny-gemma"))
    tokenizer = model.preprocessor.tokenizer
    ids = [tokenizer.token_to_id(c) for c in "abUSxUSER"]
    assert tokenizer.token_to_id("<unk>") not in ids
    monkeypatch.setattr(streaming, "_decoder", lambda lm: ScriptedDecoder(ids))
    generation = stream_generate(model, "Hi", max_new_tokens=20, stop_strings=["USER:", "SER"])
    deltas = list(generation)
    # "US" is held back until "x" shows it starts no stop string; the last "US" until "USE"
    # turns out to contain the stop string "SER", then the text is cut before it.
    assert deltas == ["a", "b", "USx", "U"]
    assert "".join(deltas) == generation.text == "abUSxU"
    assert generation.stop_reason == "stop"


# --- Fast tokenizer paths -------------------------------------------------------------------

BUNDLED = REPO_ROOT / "inference" / "presets"


@pytest.mark.parametrize("name", ["gemma-calendar", "mistral-calendar"])
def test_sentencepiece_fast_paths_equal_the_public_ones(name: str) -> None:
    """The engine's encoder and decoder (SentencePiece directly, and a piece table that keeps
    the GIL) give exactly what the keras-hub tokenizer gives, on calendar dialogs."""
    from inference.building.demo_models import calendar_corpus

    tokenizer = keras_hub.models.CausalLM.from_preset(str(BUNDLED / name)).preprocessor.tokenizer
    encode, decode = streaming._encoder(tokenizer), streaming._detokenizer(tokenizer)
    assert isinstance(decode, streaming._PieceTableDecoder)
    assert encode == tokenizer._sentence_piece_spm.EncodeAsIds
    family = name.split("-")[0]
    for text in calendar_corpus(family, seed=5, size=40):
        ids = [int(i) for i in np.asarray(tokenizer([text])[0]).reshape(-1)]
        assert list(encode(text)) == ids
        assert decode(ids) == tokenizer.detokenize(ids)
        assert decode(ids[3:17]) == tokenizer.detokenize(ids[3:17])  # A slice starting mid-text.


def test_piece_table_decoder_shows_every_bad_byte(presets_dir: Path) -> None:
    tokenizer = load_causal_lm(str(presets_dir / "tiny-gemma")).preprocessor.tokenizer
    decode = streaming._detokenizer(tokenizer)
    # "é" is C3 A9: C3 alone, or followed by a byte that cannot continue it, is invalid.
    ids = [tokenizer.token_to_id(piece) for piece in ("A", "<0xC3>", "<0xC3>", "<0xA9>", "<0xE6>", "<0x84>", "B")]
    assert decode(ids) == tokenizer._sentence_piece_spm.DecodeIds(ids) == "A\ufffd\u00e9\ufffd\ufffdB"


# --- Loading, compilation, imports ---------------------------------------------------------


def test_load_causal_lm_loads_once_across_threads(presets_dir: Path) -> None:
    preset = str(presets_dir / "tiny-llama3")
    results: list[keras_hub.models.CausalLM] = []
    threads = [threading.Thread(target=lambda: results.append(load_causal_lm(preset))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert load_causal_lm(preset) is results[0]


def test_bucket_length() -> None:
    assert [bucket_length(n, 512) for n in (1, 64, 65, 128, 129, 300, 600)] == [64, 64, 128, 128, 256, 512, 512]
    assert bucket_length(100, 96) == 96


def test_similar_prompts_do_not_recompile(lm: keras_hub.models.CausalLM, family: str) -> None:
    warm_up(lm, (64,))
    decoder = streaming._decoder(lm)
    traces = (decoder.prefill_traces, decoder.step_traces)
    for request in ("Hi", "Add a meeting with Paul on the next day at 8am. 1/2h."):
        list(stream_generate(lm, prompt_for(family, request, system=None), max_new_tokens=8))
    assert (decoder.prefill_traces, decoder.step_traces) == traces


def test_generation_objects_are_plain_iterators(lm: keras_hub.models.CausalLM, family: str) -> None:
    generation = StreamingGeneration(lm, prompt_for(family, "Hi"), max_new_tokens=3)
    assert iter(generation) is generation


def test_no_tensorflow_import() -> None:
    code = (
        "import os, sys; os.environ.setdefault('KERAS_BACKEND', 'jax'); "
        "import inference.streaming, inference.building.demo_models, inference.chat_templates, keras_hub; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'; "
        "assert 'tensorflow_text' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)
