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

Only batch size 1 and greedy decoding are supported here; ``inference.engine`` serves many
requests at once (continuous batching, sampling) and reuses this module's prompt encoding,
stop-token resolution and incremental text (``IncrementalText``).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import codecs
import itertools
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
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
        from inference.hosts import compile_cache
        from inference.keras_build import causal_lm_from_preset

        compile_cache.enable()
        lm = causal_lm_from_preset(preset)
        with _models_lock:
            _models[preset] = lm
        return lm


def unload_causal_lm(chosen: Callable[[str], bool]) -> list[str]:
    """Drop the loaded models whose preset ``chosen`` picks (their memory is freed once nothing
    else holds them); their presets."""
    with _models_lock:
        presets = [preset for preset in _models if chosen(preset)]
        for preset in presets:
            del _models[preset]
    return presets


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
    ids = _encoder(tokenizer)(prompt) if prompt else []
    if add_start:
        ids.insert(0, int(tokenizer.start_token_id))
    return ids


def _public_encode(tokenizer: Any) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        return [int(i) for i in np.asarray(tokenizer([text])[0]).reshape(-1)]

    return encode


# Texts an encoder must tokenize exactly as the tokenizer does before it replaces it: chat
# markers of every family, digits, punctuation, spaces, accents, an emoji.
_ENCODE_PROBES = (
    "Add a meeting with Fred on Nov 11 at 5PM",
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "[INST] Cancel it. [/INST]",
    '  action.add_calendar_entry("Yoga", date="2024-03-05", time="19:30", duration=60*2)  ',
    "Café à 20h — naïve résumé 😀\n\n\tx",
)


def _sentencepiece_processor(tokenizer: Any) -> Any:
    """The SentencePiece processor inside a keras-hub tokenizer that has one (no TensorFlow), or
    None. keras-hub private API: callers catch any surprise and fall back to the public one."""
    initialise = getattr(tokenizer, "_maybe_initialized_spm", None)
    use_tf = getattr(tokenizer, "_use_tf_workflow", None)
    if initialise is None or use_tf is None or use_tf():
        return None
    initialise()
    return tokenizer._sentence_piece_spm


def _sentencepiece_encode(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """SentencePiece's own ``EncodeAsIds`` behind a keras-hub tokenizer, when it is exact.

    keras-hub's public call goes through SentencePiece's batch API and keras tensors: ~250 us a
    prompt, against ~30 us, and a submitting thread holds the GIL for much of it, which the
    engine's decode thread then waits for. None where a probe disagrees or anything surprises.
    """
    try:
        processor = _sentencepiece_processor(tokenizer)
        if processor is None:
            return None
        encode_ids = processor.EncodeAsIds
        public = _public_encode(tokenizer)
        if all(list(encode_ids(text)) == public(text) for text in _ENCODE_PROBES):
            return encode_ids
    except Exception:  # A private API moved: fall back to the public one.
        return None
    return None


_fast_encoders: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """The fastest exact encoder of one text into ids; probed once per tokenizer."""
    with _fast_paths_lock:
        encode = _fast_encoders.get(tokenizer)
        if encode is None:
            encode = _fast_encoders[tokenizer] = _sentencepiece_encode(tokenizer) or False
    return encode or _public_encode(tokenizer)


def _single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` if it is one token of the vocabulary (special tokens included)."""
    try:
        token_id = int(tokenizer.token_to_id(text))
        if tokenizer.id_to_token(token_id) == text:
            return token_id
    except (ValueError, KeyError, TypeError):
        pass
    ids = _encoder(tokenizer)(text)
    return ids[0] if len(ids) == 1 else None


def stop_token_ids(tokenizer: Any, stop_strings: Sequence[str] = ()) -> frozenset[int]:
    """Token ids that end a generation: the tokenizer's end token(s) and single-token stop strings.

    Raises ValueError for an empty stop string (it would match everywhere).
    """
    ids = {int(tokenizer.end_token_id)}
    if getattr(tokenizer, "end_token2_id", None) is not None:
        ids.add(int(tokenizer.end_token2_id))
    for stop in stop_strings:
        if not stop:
            raise ValueError("Stop strings must not be empty.")
        token_id = _single_token_id(tokenizer, stop)
        if token_id is not None:
            ids.add(token_id)
    return frozenset(ids)


# SentencePiece shows every byte of an invalid UTF-8 sequence as U+FFFD (Python's "replace"
# shows one per maximal invalid subsequence).
_EVERY_BAD_BYTE = "fix-arena-every-bad-byte"
codecs.register_error(_EVERY_BAD_BYTE, lambda error: (REPLACEMENT_CHAR * (error.end - error.start), error.end))


class _PieceTableDecoder:
    """SentencePiece decoding in Python, from the model's table of pieces.

    ``DecodeIds`` releases the GIL: in a process where other threads are runnable (the engine's
    readers, a worker's publishers), each call then waits for the GIL to come back, up to the
    interpreter's switch interval (measured: 5 us alone, over 1 ms beside one busy thread). Ids
    are pieces laid end to end, "▁" standing for a space, byte pieces ("<0x0A>") for raw bytes,
    control pieces for nothing, the unknown piece for " ⁇ "; the model may drop the space the
    first piece begins with. Only used where it gives exactly ``DecodeIds``'s text on a probe.
    """

    def __init__(self, processor: Any) -> None:
        pieces = []
        for index in range(processor.GetPieceSize()):
            piece = processor.IdToPiece(index)
            if processor.IsControl(index):
                pieces.append(b"")
            elif processor.IsByte(index):
                pieces.append(bytes([int(piece[3:-1], 16)]))
            elif processor.IsUnknown(index):
                pieces.append(" \u2047 ".encode())
            else:
                pieces.append(piece.replace("\u2581", " ").encode())
        self._pieces = pieces
        # Whether the model drops the space its first piece begins with (add_dummy_prefix).
        spaced = next(i for i, piece in enumerate(pieces) if piece.startswith(b" ") and len(piece) > 1)
        self._strip_first_space = not processor.DecodeIds([spaced]).startswith(" ")

    def __call__(self, ids: list[int]) -> str:
        pieces = self._pieces
        text = b"".join([pieces[i] for i in ids]).decode("utf-8", errors=_EVERY_BAD_BYTE)
        if self._strip_first_space and text.startswith(" ") and pieces[ids[0]].startswith(b" "):
            return text[1:]
        return text


def _probe_ids(vocabulary: int, seed: int = 0) -> list[list[int]]:
    """Id sequences that exercise a decoder: every id alone, and random runs of ids."""
    rng = random.Random(seed)
    runs = [[i] for i in range(vocabulary)]
    runs += [[rng.randrange(vocabulary) for _ in range(rng.randrange(2, 40))] for _ in range(300)]
    return runs


def _sentencepiece_decode(tokenizer: Any) -> Callable[[list[int]], str] | None:
    """A fast exact decoder for a keras-hub SentencePiece tokenizer, when it is safe to use.

    Without TensorFlow, keras-hub's SentencePieceTokenizer always decodes through
    SentencePiece's *batch* API, which hands the work to a thread pool: ~60 us per call even for
    a few ids. ``DecodeIds`` takes ~5 us but releases the GIL (see _PieceTableDecoder), which
    gives the same text without releasing it when a probe of every id and random runs of ids
    agree. Incremental detokenisation decodes once per token (or per dispatch and stream), so
    this is the host cost of a step. None (use the public ``detokenize``) for other tokenizers,
    or any surprise.
    """
    try:
        processor = _sentencepiece_processor(tokenizer)
        if processor is None:
            return None
        decode_ids = processor.DecodeIds
        probe = list(range(min(int(tokenizer.vocabulary_size()), 64)))
        if decode_ids(probe) != tokenizer.detokenize(probe):
            return None
        table = _PieceTableDecoder(processor)
        if all(table(ids) == decode_ids(ids) for ids in _probe_ids(processor.GetPieceSize())):
            return table
    except Exception:  # A private API moved: fall back to the public one.
        return None
    return decode_ids


# Values never refer to their tokenizer (a bound method of the SentencePiece processor, or
# False), so entries go away with the tokenizer.
_fast_decoders: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_fast_paths_lock = threading.Lock()


def _detokenizer(tokenizer: Any) -> Callable[[list[int]], str]:
    """The fastest exact detokenizer for a flat list of ids; probed once per tokenizer."""
    with _fast_paths_lock:
        decode = _fast_decoders.get(tokenizer)
        if decode is None:
            decode = _fast_decoders[tokenizer] = _sentencepiece_decode(tokenizer) or False
    return decode or tokenizer.detokenize


class IncrementalText:
    """Turns generated token ids into text deltas that never need to be taken back.

    Shared by the batch-1 stream here and the continuous-batching engine (inference.engine).
    The caller feeds the generated ids (stop-token ids excluded) with ``add``, which returns the
    newly shown text; ``finish`` returns what was held back. The whole sequence is decoded each
    time (a slice of ids does not always decode to a slice of the text), and the tail is held
    back while it is an incomplete UTF-8 character (U+FFFD) or could be the start of a stop
    string. Special tokens are dropped from the text, as ``generate()``'s post-processing drops
    them. Not thread-safe: one generation is advanced by one thread at a time.
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = ()) -> None:
        self._detokenize = _detokenizer(tokenizer)
        # Also matched in the text: a model can spell a marker with several ordinary tokens.
        self._text_stops = tuple(stop_strings)
        self._skip_ids = frozenset(int(i) for i in getattr(tokenizer, "special_token_ids", []))
        self.token_ids: list[int] = []
        self.text = ""  # Everything returned so far.
        self.stopped = False  # A stop string showed up in the decoded text.

    def add(self, token_ids: Iterable[int]) -> str:
        """Append generated ids; return the text that became safe to show ("" if none).

        Once a stop string appears, ``stopped`` is set and nothing more is returned until
        ``finish()``, which cuts the text before it.
        """
        self.token_ids.extend(token_ids)
        if self.stopped:
            return ""
        text = self._decode()
        if self._text_stops and any(s in text for s in self._text_stops):
            self.stopped = True
            return ""
        end = self._stable_end(text)
        if end <= len(self.text):
            return ""
        delta = text[len(self.text) : end]
        self.text += delta
        return delta

    def finish(self) -> str:
        """The rest of the reply (held-back text flushed, cut before the first stop string)."""
        text = self._decode()
        positions = [p for p in (text.find(s) for s in self._text_stops) if p >= 0]
        if positions:
            text = text[: min(positions)]
            self.stopped = True
        if len(text) <= len(self.text):
            return ""
        delta = text[len(self.text) :]
        self.text += delta
        return delta

    def _decode(self) -> str:
        ids = [i for i in self.token_ids if i not in self._skip_ids]
        return self._detokenize(ids) if ids else ""

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


def stateless_model(model_ref: Callable[[], Any], state: tuple[list[Any], list[Any]]) -> tuple[Any, Any]:
    """The model and a StatelessScope binding its variables to ``state`` (trainable, non-trainable).

    Compiled functions take the variables as arguments rather than closing over them, as
    ``generate()`` does under JAX: one compiled program then serves every call, and sharded
    variables keep their shardings.
    """
    import keras

    model = model_ref()
    trainable, non_trainable = state
    mapping = itertools.chain(
        zip(model.trainable_variables, trainable, strict=True),
        zip(model.non_trainable_variables, non_trainable, strict=True),
    )
    return model, keras.StatelessScope(state_mapping=mapping)


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
            return stateless_model(model_ref, state)

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


# How often a reader of deltas wants an empty one when no text comes: seconds, a function giving
# the seconds until its next tick, or None (never).
Tick = float | Callable[[], float] | None


class DeltaQueue:
    """A reply's text deltas, handed from the thread that produces them to the one that reads
    them (the engine's ``Request``, a streamed endpoint reply): the reader iterates ``deltas``,
    the producer calls ``_put`` for each delta and ``_close`` once, after the outcome is set.
    ``_failure()`` says what iteration and ``result()`` raise at the end (None: nothing)."""

    _END = object()

    def __init__(self) -> None:
        self.text = ""
        self._deltas: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._finished = threading.Event()
        self._drained = False

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def __iter__(self) -> Iterator[str]:
        return self.deltas(tick=None)

    def deltas(self, tick: Tick) -> Iterator[str]:
        """The text deltas, and (with a ``tick``) an empty string whenever ``tick`` seconds pass
        without one: a reader that shows text on a clock (the arena's pacing) gets to run
        between the model's bursts. ``tick`` may be a function, asked before each wait: the
        seconds until the reader's next tick."""
        while not self._drained:
            try:
                item = self._deltas.get(timeout=tick() if callable(tick) else tick)
            except queue.Empty:
                yield ""
                continue
            if item is self._END:
                self._drained = True
                break
            yield item
        self._raise_failure()

    def result(self, timeout: float | None = None) -> str:
        """Wait for the end (without iterating) and return the whole text; raise on failure."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"The generation did not finish within {timeout} s.")
        self._raise_failure()
        return self.text

    def _failure(self) -> BaseException | None:
        return None

    def _raise_failure(self) -> None:
        failure = self._failure()
        if failure is not None:
            raise failure

    def _put(self, delta: str) -> None:
        self.text += delta
        self._deltas.put(delta)

    def _close(self) -> None:
        # Outcome first, end marker last: a consumer that sees the end sees the outcome.
        self._finished.set()
        self._deltas.put(self._END)


@dataclass
class GenerationStats:
    """Timing of one generation; the arena shows and records these per reply."""

    tokens: int = 0  # Generated tokens in the reply (a stop token is not counted).
    # Measured from the start of iteration here, from submit() in inference.engine.
    ttft_s: float | None = None  # Until the first new token.
    duration_s: float = 0.0  # Until the end of the generation.

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
        self._stop_ids = stop_token_ids(tokenizer, stop_strings)
        self._text = IncrementalText(tokenizer, stop_strings)
        self._should_cancel = should_cancel

        self.text = ""
        self.stop_reason: StopReason | None = None
        self.stats = GenerationStats()
        self._cancel_requested = False
        self._iterator: Iterator[str] | None = None

    @property
    def token_ids(self) -> list[int]:
        """The generated ids so far (a stop token is not included)."""
        return self._text.token_ids

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

    def _run(self) -> Iterator[str]:
        decoder = _decoder(self.lm)
        state = _model_state(self.lm)
        start = time.perf_counter()
        prompt_length = len(self.prompt_ids)
        padded = np.full((1, self.padded_length), self._pad_id(), dtype=np.int32)
        padded[0, :prompt_length] = self.prompt_ids
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
                delta = self._text.add((token_id,))
                if delta:
                    self.text += delta
                    yield delta
                if len(self.token_ids) >= self.max_new_tokens:
                    self.stop_reason = "length"
                    break
                if self._text.stopped:
                    break  # finish() cuts the text before the stop string.
            # Flush what was held back (an incomplete character, a partial stop string).
            delta = self._text.finish()
            if self._text.stopped:
                self.stop_reason = "stop"
            if delta:
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
