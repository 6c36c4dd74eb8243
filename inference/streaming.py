"""Token-by-token greedy generation for keras-hub causal LMs, on JAX.

keras-hub's ``CausalLM.generate()`` compiles the whole decoding loop and returns only at the end,
so it cannot stream (keras-hub issue 976). This module runs the same computation as a Python
loop around two jit-compiled functions, so that each token can be shown as soon as it exists:

* ``prefill``: builds the key/value cache with the model's own ``_build_cache`` over the padded
  prompt, then runs the first ``call_with_cache`` step at the last prompt position, exactly as
  ``generate_step`` does, and returns the first new token;
* ``step``: one ``call_with_cache`` call on the previous token, then greedy argmax.

Both take the model variables as arguments (stateless, as ``generate()`` does under JAX), so one
compiled function serves every request, and greedy output is identical to
``lm.generate(prompt)`` with ``sampler="greedy"``. The padded sequence length is bucketed
(powers of two from 64, capped at the context length): similar prompts reuse the compiled
functions instead of paying a 3-7 s recompilation each. The cache buffer is donated to ``step``
so it is updated in place.

Prompt handling matches keras-hub's preprocessor (tokenize, prepend the start token when the
preprocessor does), with one deliberate difference: a prompt that already starts with the start
token's text (the Llama 3 template starts with ``<|begin_of_text|>``) loses that text first, so
the model sees one start token, not two. ``generate()`` would double it.

Text is produced by decoding all generated ids at each step and emitting the new suffix, holding
back a trailing U+FFFD (an incomplete UTF-8 character split across byte-fallback tokens) and any
tail that could be the start of a stop string. Stop strings stop generation twice over: on their
token id when they are one token (``<end_of_turn>``, ``<|eot_id|>``, ``</s>``), and in the
decoded text whatever tokens spelled them. Special tokens (start, end, padding,
header markers) are dropped from the text, as ``generate()``'s post-processing drops them.

Only batch size 1 and greedy decoding are supported here; continuous batching is a separate
concern (see shared/facts.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import keras_hub

StopReason = Literal["stop", "length", "cancelled"]

MIN_BUCKET = 64
REPLACEMENT_CHAR = "\ufffd"

_models: dict[str, keras_hub.models.CausalLM] = {}
_model_locks: dict[str, threading.Lock] = {}
_models_lock = threading.Lock()


def load_causal_lm(preset: str) -> keras_hub.models.CausalLM:
    """Load a CausalLM once per process and preset (a local folder or a Kaggle/HF handle).

    Loading takes seconds and holds the weights in memory, so every caller in the process shares
    one instance. A lock per preset makes concurrent first calls load it only once, while
    different presets still load in parallel.
    """
    with _models_lock:
        if preset in _models:
            return _models[preset]
        lock = _model_locks.setdefault(preset, threading.Lock())
    with lock:
        with _models_lock:
            if preset in _models:
                return _models[preset]
        import keras_hub

        lm = keras_hub.models.CausalLM.from_preset(preset)
        with _models_lock:
            _models[preset] = lm
        return lm


def bucket_length(length: int, limit: int) -> int:
    """The padded length for ``length`` tokens: the next power of two >= 64, capped at ``limit``.

    Few distinct shapes mean few compilations; the cap keeps the cache within the context the
    model (and its preprocessor) was configured for.
    """
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, limit)


def context_length(lm: keras_hub.models.CausalLM) -> int:
    """The longest sequence (prompt plus reply) ``lm`` is set up for.

    That is the preprocessor's ``sequence_length`` (what ``generate()`` uses by default),
    lowered to the backbone's ``max_sequence_length`` where the architecture has one.
    """
    if lm.preprocessor is None:
        raise ValueError("Streaming needs a CausalLM with a preprocessor (for its tokenizer).")
    limit = int(lm.preprocessor.sequence_length)
    backbone_limit = getattr(lm.backbone, "max_sequence_length", None)
    if backbone_limit:
        limit = min(limit, int(backbone_limit))
    return limit


def encode_prompt(lm: keras_hub.models.CausalLM, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as generation sees them (start token included, once)."""
    preprocessor = lm.preprocessor
    if preprocessor is None:
        raise ValueError("Streaming needs a CausalLM with a preprocessor (for its tokenizer).")
    tokenizer = preprocessor.tokenizer
    start_token = getattr(tokenizer, "start_token", None)
    add_start = bool(getattr(preprocessor, "add_start_token", False)) and start_token is not None
    if add_start and prompt.startswith(start_token):
        prompt = prompt[len(start_token) :]
    ids = [int(i) for i in np.asarray(tokenizer([prompt])[0]).reshape(-1)] if prompt else []
    if add_start:
        ids.insert(0, int(tokenizer.start_token_id))
    return ids


def _single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` if it is one token of the vocabulary (special tokens included)."""
    try:
        token_id = int(tokenizer.token_to_id(text))
        if tokenizer.id_to_token(token_id) == text:
            return token_id
    except (ValueError, KeyError, TypeError):
        pass
    ids = np.asarray(tokenizer([text])[0]).reshape(-1)
    return int(ids[0]) if ids.size == 1 else None


class _CompiledDecoder:
    """The jit-compiled prefill and step functions of one model.

    Created once per model and kept as long as the model lives; jax caches one compiled
    executable per padded length inside each function.
    """

    def __init__(self, lm: keras_hub.models.CausalLM) -> None:
        import jax
        import keras
        import keras_hub

        if not (hasattr(lm, "_build_cache") and hasattr(lm, "call_with_cache")):
            raise TypeError(f"{type(lm).__name__} has no cached decoding (_build_cache).")
        model_ref = weakref.ref(lm)  # Held in a WeakKeyDictionary keyed by the model: no cycle.
        sampler = keras_hub.samplers.GreedySampler()
        # Python bodies run only when jax traces (compiles) them: these count compilations.
        self.prefill_traces = 0
        self.step_traces = 0

        def stateless(state: tuple[list[Any], list[Any]]) -> tuple[Any, Any]:
            model = model_ref()
            trainable, non_trainable = state
            mapping = itertools.chain(
                zip(model.trainable_variables, trainable, strict=True),
                zip(model.non_trainable_variables, non_trainable, strict=True),
            )
            return model, keras.StatelessScope(state_mapping=mapping)

        def next_token(model: Any, token: Any, cache: Any, index: Any) -> tuple[Any, Any]:
            logits, _, cache = model.call_with_cache(token, cache, index)
            # The same float32 softmax + argmax as GreedySampler inside generate(), so that
            # near-ties resolve identically.
            probabilities = sampler.compute_probabilities(logits[:, 0, :])
            token = keras.ops.cast(sampler.get_next_token(probabilities), "int32")
            return token[:, None], cache

        def prefill(state: Any, token_ids: Any, length: Any) -> tuple[Any, Any]:
            self.prefill_traces += 1
            model, scope = stateless(state)
            with scope:
                _, cache = model._build_cache(token_ids)
                last = keras.ops.slice(token_ids, [0, length - 1], [1, 1])
                return next_token(model, last, cache, length - 1)

        def step(state: Any, token: Any, cache: Any, index: Any) -> tuple[Any, Any]:
            self.step_traces += 1
            model, scope = stateless(state)
            with scope:
                return next_token(model, token, cache, index)

        self.prefill = jax.jit(prefill)
        self.step = jax.jit(step, donate_argnums=(2,))


_decoders: weakref.WeakKeyDictionary[Any, _CompiledDecoder] = weakref.WeakKeyDictionary()
_decoders_lock = threading.Lock()


def _decoder(lm: keras_hub.models.CausalLM) -> _CompiledDecoder:
    with _decoders_lock:
        decoder = _decoders.get(lm)
        if decoder is None:
            decoder = _decoders[lm] = _CompiledDecoder(lm)
        return decoder


def _model_state(lm: keras_hub.models.CausalLM) -> tuple[list[Any], list[Any]]:
    # `.value` keeps any sharding of distributed variables, as generate() does.
    return (
        [v.value for v in lm.trainable_variables],
        [v.value for v in lm.non_trainable_variables],
    )


@dataclass
class GenerationStats:
    """Timing of one generation; the arena shows and records these per reply."""

    tokens: int = 0  # Generated tokens in the reply (a stop token is not counted).
    ttft_s: float | None = None  # From the start of iteration to the first new token.
    duration_s: float = 0.0  # From the start of iteration to its end.

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the whole generation (0.0 before any time passed)."""
        return self.tokens / self.duration_s if self.duration_s > 0 else 0.0


class StreamingGeneration:
    """An iterator of text deltas for one greedy generation, with its outcome afterwards.

    Iterate it to run the generation; every item is a non-empty string, and their concatenation
    is the reply. After iteration, ``stop_reason`` says why it ended ("stop": a stop token or
    stop string, which is not part of the text; "length": ``max_new_tokens`` or the context was
    used up; "cancelled": ``should_cancel()`` returned True or ``close()`` was called) and
    ``stats`` holds the token count and timings. Invalid requests raise ValueError at
    construction, before any work is queued.
    """

    def __init__(
        self,
        lm: keras_hub.models.CausalLM,
        prompt: str,
        *,
        max_new_tokens: int,
        stop_strings: Sequence[str] = (),
        should_cancel: Callable[[], bool] | None = None,
    ) -> None:
        if not prompt or not prompt.strip():
            raise ValueError("The prompt is empty.")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
        self.lm = lm
        self.prompt_ids = encode_prompt(lm, prompt)
        limit = context_length(lm)
        if len(self.prompt_ids) + 1 > limit:
            raise ValueError(
                f"The prompt is {len(self.prompt_ids)} tokens long but the model's context is "
                f"{limit} tokens: it must leave room for at least one new token."
            )
        self.padded_length = bucket_length(len(self.prompt_ids) + max_new_tokens, limit)
        self.max_new_tokens = min(max_new_tokens, self.padded_length - len(self.prompt_ids))

        tokenizer = lm.preprocessor.tokenizer
        self._tokenizer = tokenizer
        stop_ids = {int(tokenizer.end_token_id)}
        if getattr(tokenizer, "end_token2_id", None) is not None:
            stop_ids.add(int(tokenizer.end_token2_id))
        for stop in stop_strings:
            if not stop:
                raise ValueError("Stop strings must not be empty.")
            token_id = _single_token_id(tokenizer, stop)
            if token_id is not None:
                stop_ids.add(token_id)
        self._stop_ids = frozenset(stop_ids)
        # Also matched in the text: a model can spell a marker with several ordinary tokens.
        self._text_stops = tuple(stop_strings)
        self._skip_ids = frozenset(int(i) for i in getattr(tokenizer, "special_token_ids", []))
        self._should_cancel = should_cancel

        self.token_ids: list[int] = []
        self.text = ""
        self.stop_reason: StopReason | None = None
        self.stats = GenerationStats()
        self._cancel_requested = False
        self._iterator: Iterator[str] | None = None

    def __iter__(self) -> StreamingGeneration:
        return self

    def __next__(self) -> str:
        if self._iterator is None:
            self._iterator = self._run()
        return next(self._iterator)

    def close(self) -> None:
        """Stop at the next token (e.g. the client went away); stop_reason becomes "cancelled"."""
        self._cancel_requested = True

    def _cancelled(self) -> bool:
        return self._cancel_requested or bool(self._should_cancel and self._should_cancel())

    def _decode(self) -> str:
        ids = [i for i in self.token_ids if i not in self._skip_ids]
        return self._tokenizer.detokenize(ids) if ids else ""

    def _stable_end(self, text: str) -> int:
        """How much of ``text`` can be shown without risk of being revised later."""
        end = len(text)
        while end > 0 and text[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        holdback = 0
        for stop in self._text_stops:
            for size in range(min(len(stop) - 1, end), holdback, -1):
                if text.endswith(stop[:size], 0, end):
                    holdback = size
                    break
        return end - holdback

    def _final_text(self) -> str:
        """The whole reply: all generated ids decoded, cut before the first stop string."""
        text = self._decode()
        positions = [p for p in (text.find(s) for s in self._text_stops) if p >= 0]
        if positions:
            text = text[: min(positions)]
            self.stop_reason = "stop"
        return text

    def _run(self) -> Iterator[str]:
        decoder = _decoder(self.lm)
        state = _model_state(self.lm)
        start = time.perf_counter()
        prompt_length = len(self.prompt_ids)
        padded = np.full((1, self.padded_length), self._pad_id(), dtype=np.int32)
        padded[0, :prompt_length] = self.prompt_ids
        emitted = 0
        token = cache = None
        try:
            while True:
                if self._cancelled():
                    self.stop_reason = "cancelled"
                    break
                # NumPy scalars and np.asarray keep host work per token small: indexing a jax
                # array or building one with jnp each dispatch an extra device op (~0.1 ms).
                if cache is None:
                    token, cache = decoder.prefill(state, padded, np.int32(prompt_length))
                else:
                    position = prompt_length + len(self.token_ids) - 1
                    token, cache = decoder.step(state, token, cache, np.int32(position))
                token_id = int(np.asarray(token)[0, 0])
                if self.stats.ttft_s is None:
                    self.stats.ttft_s = time.perf_counter() - start
                if token_id in self._stop_ids:
                    self.stop_reason = "stop"
                    break
                self.token_ids.append(token_id)
                if len(self.token_ids) >= self.max_new_tokens:
                    self.stop_reason = "length"
                    break
                text = self._decode()
                if self._text_stops and any(s in text for s in self._text_stops):
                    break  # _final_text() cuts it and records the stop.
                end = self._stable_end(text)
                if end > emitted:
                    delta = text[emitted:end]
                    emitted = end
                    self.text += delta
                    yield delta
            # Flush what was held back (an incomplete character, a partial stop string).
            text = self._final_text()
            if len(text) > emitted:
                delta = text[emitted:]
                self.text += delta
                yield delta
        except GeneratorExit:  # The consumer stopped iterating early.
            self.stop_reason = self.stop_reason or "cancelled"
            raise
        finally:
            self.stats.tokens = len(self.token_ids)
            self.stats.duration_s = time.perf_counter() - start

    def _pad_id(self) -> int:
        pad = getattr(self._tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0


def stream_generate(
    lm: keras_hub.models.CausalLM,
    prompt: str,
    *,
    max_new_tokens: int,
    stop_strings: Sequence[str] = (),
    should_cancel: Callable[[], bool] | None = None,
) -> StreamingGeneration:
    """Start a streaming greedy generation; iterate the result for text deltas.

    ``stop_strings`` that are single tokens (``<end_of_turn>``, ``<|eot_id|>``, ``</s>``) stop
    on the token, and every stop string is also matched in the text; neither appears in the
    output. The tokenizer's end token(s) always stop generation. ``should_cancel`` is polled
    before every token, so keep it cheap (e.g. read a flag that another thread sets).
    """
    return StreamingGeneration(
        lm,
        prompt,
        max_new_tokens=max_new_tokens,
        stop_strings=stop_strings,
        should_cancel=should_cancel,
    )


def warm_up(lm: keras_hub.models.CausalLM, lengths: Sequence[int] = (64, 128, 256)) -> None:
    """Compile the prefill and step functions for the given padded lengths ahead of traffic.

    Each new padded length costs a compilation (seconds on CPU); a worker calls this at start so
    the first real requests do not pay it.
    """
    decoder = _decoder(lm)
    state = _model_state(lm)
    limit = context_length(lm)
    for length in sorted({bucket_length(n, limit) for n in lengths}):
        token_ids = np.zeros((1, length), dtype=np.int32)
        token, cache = decoder.prefill(state, token_ids, np.int32(1))
        token, cache = decoder.step(state, token, cache, np.int32(1))
        token.block_until_ready()
