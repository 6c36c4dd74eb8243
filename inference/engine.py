"""Continuous batching for keras-hub causal LMs on JAX: many streams share one decode step.

``inference.streaming`` decodes one request at a time; much of each step is fixed overhead
(Python, dispatch, per-op costs, reading the weights), so serving requests one after another
wastes the machine. This engine follows JetStream's design (see shared/facts.md):

* a fixed number of decode **slots**, each with its own key/value cache: one array shaped like
  keras-hub's cache with a leading slot axis, ``[slots, 1, layers, 2, positions, kv_heads,
  head_dim]``, or, for the families with an in-place forward pass (below), per layer, separate
  key and value arrays (``inference.forward.attention``'s layout);
* **prefill** runs each new request alone, computing the keys and values of all of its prompt
  but the last token into a **staging row** of the full context length, and sets the slot's
  state (one compilation per length bucket); **insert** then copies the staging row into the
  free slot (one compilation per window). The slot starts from the prompt's last token at its
  own index: its first decode step runs that token and samples the first new token, as
  keras-hub's generate loop does after ``_build_cache`` (so greedy output stays
  ``generate()``'s), and no prefill pays a separate one-token pass over the weights. Families
  with an in-place forward pass prefill in **chunks after a cached prefix**
  (``inference.prefix_cache``): the keys and values of recent prompts' beginnings stay in a
  device pool, a new prompt starts from the longest one it shares (the chat template and
  system prompt of its task, or the previous turn of its dialog), only the rest is computed,
  padded to a bucket, and **store** copies a new prefix from the staging row into a pool row.
  A short chunk after a short prefix attends over the shortest of ``SHORT_PREFIXES`` that
  holds the prefix plus its own positions rather than a whole pool row (such buckets compile
  once for each). Other families run keras-hub's own ``_build_cache`` over the whole prompt;
* one jitted **generate** step advances *every* slot by ``steps_per_dispatch`` tokens
  (``lax.fori_loop`` with a traced trip count: by default the fewest steps that last about
  ``DISPATCH_TARGET_S``, measured as the engine runs, up to 8, so that neither a tiny model's
  dispatches nor a real model's new requests wait on a long dispatch). Slots sit at
  different positions, while keras-hub's ``call_with_cache`` takes one
  ``cache_update_index`` for the whole batch, so the step ``jax.vmap``s a batch-1
  ``call_with_cache`` over the slot axis with a per-slot index: the
  cache write (``dynamic_update_slice``, a scatter under vmap), the rotary position and the
  causal mask all accept a traced per-slot index. Free slots compute too (the shape is fixed);
  their output is ignored and their index is clamped into the cache;
* **Gemma, Gemma 3, Llama 3 (SmolLM2 included) and Mistral** models get a forward pass of the
  engine's own instead (``inference.forward``, one module per family; ``_in_place_decoder``
  says when it applies; Gemma 3 runs only this way, since its keras-hub cache also takes image
  inputs), used
  for decode steps (one token per slot) and prefill chunks (many tokens of one slot): the same
  computation with the model's own layers (norms, rotary embeddings, kernels; the weights that
  plain matmuls would otherwise transpose at every token laid out once per engine), but each
  layer's keys and values are separate heads-first arrays updated in place, attended by
  grouped-query contractions that never repeat them per query head
  (``inference.forward.attention``). keras-hub's cached attention slices the layer
  out of one stacked cache, updates and restacks it at every token, which on a CPU costs more
  than the arithmetic (measured, 8 slots, a 256-position window: the first strong Gemma model
  2.1 ms a step through ``call_with_cache``, 0.55 ms in place; the 2-layer Mistral model
  0.67 ms, 0.45 ms);
* the slot caches hold a **window** of positions, the smallest of a few lengths (powers of
  two, from 256 on also 1.5 times each, up to the context) that holds every running
  request's positions during the next dispatch, so a step costs in proportion to slots x
  window, not slots x context. The caches are **resized** (cut, or padded with zeros) only
  when that window changes, one neighbouring length at a time (one compilation per pair); a
  decode step works on them in place. (An earlier version kept full-context caches and copied
  the window out and back at every dispatch: with SmolLM2 that copy cost more than the
  attention itself.);
* a slot is freed on a stop token, its token limit, the end of the context, or cancellation,
  and the next queued request is prefilled into it at the next iteration.

A background **decode thread** owns all device state and runs the loop; ``submit()`` can be
called from any number of threads and returns a ``Request`` whose iteration yields text deltas
as the decode thread produces them. Per dispatch the host reads the new tokens once
(``np.asarray``) and dispatches the next step *before* turning the previous tokens into text,
so detokenisation overlaps the device work (JAX dispatches asynchronously); a slot freed by
that processing simply has one wasted dispatch, and the thread waits a fraction of a
millisecond for its reader's next request (``_await_resubmission``). Cache, staging, pool and
slot arrays are donated to the jitted calls that write them, so they are updated in place.

Sampling happens inside the jitted step with per-slot parameter arrays, so mixed requests share
one compiled step: greedy (temperature 0: the same float32 softmax as keras-hub's
``GreedySampler`` and its argmax, the first best token), temperature, top-k and top-p, with a
per-slot PRNG key derived from the request's seed and split once per token (same seed and
prompt, same text, whatever else is in the batch). The sort that top-k/top-p need and the key
splits only run when some running slot samples (``lax.cond`` on the batch).

Compilations: ``warm_up()`` compiles every prefill shape, every decode window (with its insert)
and every resize between neighbouring windows; after it, no request compiles anything.
``Engine.compilations`` counts XLA compilations done on the engine's thread (a
``jax.monitoring`` listener), so a benchmark can show that none happen after warm-up. Compiled
functions are shared by engines of the same model and configuration.

The model variables are passed to the jitted functions as arguments (stateless, as
``generate()`` does), so variables sharded with ``keras.distribution`` keep their shardings,
and the caches are created by a jitted function of the variables, on their devices.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import collections
import functools
import logging
import math
import numbers
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from inference.prefix_cache import NO_MATCH, PrefixCache
from inference.streaming import (
    MIN_BUCKET,
    GenerationStats,
    IncrementalText,
    _model_state,
    context_length,
    encode_prompt,
    stateless_model,
    stop_token_ids,
)

if TYPE_CHECKING:
    import keras_hub

logger = logging.getLogger(__name__)

EngineStopReason = Literal["stop", "length", "cancelled", "error"]

# Tokens per slot per dispatch, at most. Measured with the strong demo model (bench_engine, 2 CPU
# cores, 8 concurrent requests): 8 tokens per dispatch gave 5276 tokens/s against 4245 with 4
# and 5063 with 16.
DEFAULT_STEPS_PER_DISPATCH = 8
# By default a dispatch runs the fewest steps that take this long (measured as the engine runs),
# up to the maximum: a dispatch amortises the host's work of a loop iteration (about a
# millisecond), while every step beyond what that needs delays a new request's prefill and
# keeps a finished request's slot busy. A tiny model's step takes a fraction of a millisecond
# (all 8 steps); a real model's tens of milliseconds (1 step).
DISPATCH_TARGET_S = 0.01
DEFAULT_PREFIX_CACHE_ROWS = 16
PREFIX_BLOCK = 16  # Prefixes are cached and matched in blocks of this many tokens.
# A prefill chunk after a cached prefix of at most one of these many tokens (a task's template
# and system prompt, a dialog's first turns) attends over that many positions plus its own rather
# than the whole pool row's: SmolLM2, a 96-token chunk after 112 cached tokens, 229 ms against
# 293 ms with the 1024-position row (scratch timing, an Intel Xeon), and 150 ms over 128 + 96
# positions against 173 ms over 256 + 96 (an AMD EPYC, Zen 5). Chunks of at most the longest
# compile for each of them and for the whole row.
SHORT_PREFIXES = (128, 256)
# Chunks after a cached prefix are mostly short (a dialog's new turn): up to this many tokens,
# the prefill buckets come every PREFIX_BLOCK tokens (a chunk pads at most 15 tokens: SmolLM2,
# 133 ms for 80 tokens against 150 ms for 96), then two per octave.
FINE_BUCKETS_UP_TO = 128
# How long the decode thread waits for a new request after one ends (see _await_resubmission):
# well under one dispatch (about 1 ms with the strong demo model on 2 CPU cores).
RESUBMIT_GRACE_S = 0.0003
# Greedy decoding: logits at least this far below a row's largest one cannot win its softmax's
# argmax (see _sample).
GREEDY_MARGIN = 1e-3
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_KEY_IMPL = "threefry2x32"  # Explicit, so the per-slot key layout (uint32[2]) never changes.


class EngineError(RuntimeError):
    """The engine's decode loop failed while a request was queued or running."""


class EngineClosedError(RuntimeError):
    """The engine was shut down: it accepts no more requests."""


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens; the defaults are greedy decoding.

    ``temperature`` 0 is greedy (top_k/top_p are then ignored); above 0, logits are divided by
    it, then limited to the ``top_k`` most likely tokens (0: no limit), then to the smallest set
    whose probability reaches ``top_p`` (1.0: no limit), and a token is drawn with a PRNG seeded
    by ``seed``.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        def real(value: Any) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

        def integer(value: Any) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        if not real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}.")
        if not integer(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: no limit), got {self.top_k!r}.")
        if not real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1: no limit), got {self.top_p!r}.")
        if not integer(self.seed) or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()

_END = object()  # Ends a request's delta queue.


class Request:
    """One generation in an Engine: iterate it for text deltas, then read its outcome.

    Iteration blocks until the decode thread produces text and ends when the generation does;
    every item is a non-empty string and their concatenation is ``text``. Iterate a request from
    one thread only (any thread). Afterwards ``stop_reason`` is "stop" (a stop token or stop
    string, not part of the text), "length" (``max_new_tokens`` or the context was used up),
    "cancelled" (``cancel()`` or engine shutdown) or "error" (the decode loop failed: iteration
    then raises EngineError), and ``stats`` holds the token count and timings measured from
    ``submit()``.
    """

    def __init__(
        self,
        *,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        stop_ids: frozenset[int],
        text: IncrementalText,
        wake: Callable[[], None],
    ) -> None:
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens  # Already capped by the context.
        self.sampling = sampling
        self.text = ""
        self.stop_reason: EngineStopReason | None = None
        self.stats = GenerationStats()
        self.error: BaseException | None = None
        self._stop_ids = stop_ids
        self._text = text
        self._wake = wake
        self._deltas: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._submitted = time.perf_counter()
        self._cancel_requested = False
        self._finished = threading.Event()
        self._drained = False
        self._slot: int | None = None
        self._position = 0  # Next cache index the decode thread will run this request at.

    @property
    def token_ids(self) -> list[int]:
        """The generated ids so far (a stop token is not included)."""
        return self._text.token_ids

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def __iter__(self) -> Iterator[str]:
        return self.deltas(tick=None)

    def deltas(self, tick: float | None) -> Iterator[str]:
        """The text deltas, as iterating the request gives them, and (with a ``tick``) an empty
        string whenever ``tick`` seconds pass without one: a reader that shows text on a clock
        (the arena's pacing) gets to run between the model's bursts."""
        while not self._drained:
            try:
                item = self._deltas.get(timeout=tick)
            except queue.Empty:
                yield ""
                continue
            if item is _END:
                self._drained = True
                break
            yield item
        if self.stop_reason == "error":
            raise EngineError(f"The engine's decode loop failed: {self.error!r}") from self.error

    def result(self, timeout: float | None = None) -> str:
        """Wait for the end (without iterating) and return the whole text; raise on error."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"The generation did not finish within {timeout} s.")
        if self.stop_reason == "error":
            raise EngineError(f"The engine's decode loop failed: {self.error!r}") from self.error
        return self.text

    def cancel(self) -> None:
        """Stop at the next dispatch (or drop it from the queue); stop_reason becomes "cancelled"."""
        self._cancel_requested = True
        self._wake()

    # --- Called by the decode thread only ---------------------------------------------------

    def _emit(self, delta: str) -> None:
        self.text += delta
        self._deltas.put(delta)

    def _end(self, reason: EngineStopReason, error: BaseException | None = None) -> None:
        if self._finished.is_set():
            return
        if reason != "error":
            delta = self._text.finish()  # Held-back text; cut before a stop string.
            if delta:
                self._emit(delta)
            if self._text.stopped:
                reason = "stop"
        self.stop_reason = reason
        self.error = error
        self.stats.tokens = len(self._text.token_ids)
        self.stats.duration_s = time.perf_counter() - self._submitted
        # Outcome first, end marker last: a consumer that sees the end sees the outcome.
        self._finished.set()
        self._deltas.put(_END)


@dataclass
class _DeviceState:
    """What the decode thread keeps on the device: the model variables, the slot caches at the
    current window, the staging row prefills write into, the slot state, the prefix pool and
    the engine's layout of the matmul weights (in-place families)."""

    state: Any
    cache: Any
    staging: Any
    slot_state: dict[str, Any]
    pool: Any
    weights: tuple[Any, ...]


@dataclass(frozen=True)
class _Dispatch:
    """A dispatched generate step: its token array [slots, steps] (the first ``count`` columns
    hold tokens), the slot owners when it was dispatched, and when; ``timed`` when nothing was
    dispatched just before it (no prefill), so that it ran alone and its duration is a step's."""

    tokens: Any
    owners: tuple[Request | None, ...]
    count: int
    dispatched_at: float
    timed: bool


@dataclass
class _WarmUp:
    """A warm-up job for the decode thread; the caller waits on ``done``."""

    buckets: tuple[int, ...]
    windows: tuple[int, ...]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _StepTiming:
    """A job for the decode thread: time decode steps of every slot at ``window`` for about
    ``seconds``; ``step_s`` is the best step's duration. The caller waits on ``done``."""

    window: int
    seconds: float
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    step_s: float | None = None


# --- Compilation counting ---------------------------------------------------------------------

_compile_owner = threading.local()  # .engine: the Engine whose code runs on this thread.
_listener_lock = threading.Lock()
_listener_installed = False


def _install_compile_listener() -> None:
    """Count XLA compilations per engine: each one is reported on the thread that compiles."""
    global _listener_installed
    with _listener_lock:
        if _listener_installed:
            return
        import jax.monitoring

        def listener(event: str, duration: float, **kwargs: Any) -> None:
            if event == _COMPILE_EVENT:
                engine = getattr(_compile_owner, "engine", None)
                if engine is not None:
                    engine._compilations += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        _listener_installed = True


# --- The jitted functions ---------------------------------------------------------------------


def _sample(logits: Any, temperature: Any, top_k: Any, top_p: Any, keys: Any, greedy_sampler: Any) -> tuple[Any, Any]:
    """Next tokens int32[B] and advanced keys uint32[B, 2] for logits [B, V]; traced in jit."""
    import jax
    import jax.numpy as jnp

    vocabulary = logits.shape[-1]
    rank = jnp.arange(vocabulary, dtype=jnp.int32)[None, :]

    def first_largest(values: Any, best: Any) -> Any:
        # The first index of the largest value, as a max and a min: XLA's CPU argmax, a
        # variadic reduce, is slower.
        return jnp.min(jnp.where(values == best, rank, vocabulary), axis=-1).astype(jnp.int32)

    def softmax_greedy() -> Any:  # Exactly GreedySampler's: its float32 softmax, then argmax.
        probabilities = greedy_sampler.compute_probabilities(logits)
        return first_largest(probabilities, jnp.max(probabilities, axis=-1, keepdims=True))

    # The softmax only decides between logits within a hair of the largest: one at least
    # GREEDY_MARGIN below it gets a probability at most exp(-GREEDY_MARGIN) = 0.999 times the
    # largest one's, a gap float32 rounding (6e-8) cannot close. Where every row's largest logit
    # is alone within the margin, its index is the sampler's token, without the softmax's passes
    # over the vocabulary (a SmolLM2 step of 8 slots over 256 positions, scratch A/B on 2 cores:
    # 29.7 ms against 32.7, median of 8 rounds).
    scaled_logits = logits.astype(jnp.float32) / greedy_sampler.temperature
    largest = jnp.max(scaled_logits, axis=-1, keepdims=True)
    contenders = jnp.sum(scaled_logits >= largest - GREEDY_MARGIN, axis=-1)
    clear = jnp.all((contenders == 1) & jnp.isfinite(largest[:, 0]))
    greedy = jax.lax.cond(clear, lambda: first_largest(scaled_logits, largest), softmax_greedy)
    sampling = temperature > 0

    def sampled() -> tuple[Any, Any]:
        def split(key: Any) -> Any:
            return jax.random.key_data(jax.random.split(jax.random.wrap_key_data(key, impl=_KEY_IMPL)))

        pairs = jax.vmap(split)(keys)  # One split per token and slot: reproducible per request.
        next_keys, subkeys = pairs[:, 0], pairs[:, 1]
        scaled = logits.astype(jnp.float32) / jnp.where(sampling, temperature, 1.0)[:, None]
        descending = -jnp.sort(-scaled, axis=-1)
        k = jnp.where((top_k > 0) & (top_k < vocabulary), top_k, vocabulary)[:, None]
        in_top_k = rank < k
        descending = jnp.where(in_top_k, descending, -jnp.inf)
        probabilities = jax.nn.softmax(descending, axis=-1)
        mass_before = jnp.cumsum(probabilities, axis=-1) - probabilities
        # The smallest prefix whose mass reaches top_p; top_p 1 keeps all (cumsum rounding
        # could otherwise drop the tail). The best token is always kept.
        keep = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0) | (rank == 0))
        last_kept = jnp.sum(keep, axis=-1, keepdims=True) - 1
        threshold = jnp.take_along_axis(descending, last_kept, axis=-1)
        filtered = jnp.where(scaled >= threshold, scaled, -jnp.inf)

        def draw(key: Any, row: Any) -> Any:
            return jax.random.categorical(jax.random.wrap_key_data(key, impl=_KEY_IMPL), row)

        drawn = jax.vmap(draw)(subkeys, filtered).astype(jnp.int32)
        return jnp.where(sampling, drawn, greedy), next_keys

    # A real branch (not a select): an all-greedy batch skips the sort and the key splits. Keys
    # only matter to sampling slots, and a batch with one takes the branch at every token, so
    # each sampling request's key is still split once per token (same seed, same text).
    return jax.lax.cond(jnp.any(sampling), sampled, lambda: (greedy, keys))


class _InPlaceDecoder(NamedTuple):
    forward: Callable[..., Any]
    prepare: Callable[[Any], tuple[Any, ...]]  # Lays out the weights the pass multiplies by.
    layout: str | None = None  # The Llama pass's, chosen by timing (inference.forward.llama).


def _in_place_decoder(lm: Any, context: int) -> _InPlaceDecoder | None:
    """The engine's own forward pass for ``lm`` (``inference.forward``), the function that lays
    out its matmul weights for it; None where there is none.

    Only where the pass computes exactly what ``lm.call_with_cache`` does: Gemma without
    sliding windows or soft caps, Gemma 3 text models, and Llama 3 / Mistral decoders whose
    sliding window, if any, covers the context. All keep heads-first caches ``[slots, kv_heads,
    positions, head_dim]`` (``inference.forward.attention``).
    """
    import keras_hub

    from inference.forward import gemma, gemma3, llama

    backbone = lm.backbone
    blocks = backbone.transformer_layers
    if type(lm) is keras_hub.models.GemmaCausalLM and type(backbone) is keras_hub.models.GemmaBackbone:
        if all(
            not block.attention.use_sliding_window_attention
            and block.attention.logit_soft_cap is None
            and not block.dropout
            for block in blocks
        ):
            return _InPlaceDecoder(gemma.gemma_forward, gemma.gemma_weights)
        return None
    if gemma3.supports(lm):
        return _InPlaceDecoder(gemma3.gemma3_forward, gemma3.gemma3_weights)
    # Vicuna (LlamaCausalLM) has the same blocks but no engine test yet: it keeps the generic step.
    llama_like = (keras_hub.models.Llama3CausalLM, keras_hub.models.MistralCausalLM)
    if type(lm) in llama_like and type(backbone) in (keras_hub.models.Llama3Backbone, keras_hub.models.MistralBackbone):
        window = getattr(backbone, "sliding_window", None)
        if (window is None or window >= context) and not getattr(backbone, "dropout", 0):
            layout = llama.faster_layout(lm)
            return _InPlaceDecoder(
                functools.partial(llama.llama_forward, layout=layout),
                functools.partial(llama.llama_weights, layout=layout),
                layout,
            )
    return None


class _Programs:
    """The jitted functions for one model and configuration: init, prefill (keras-hub's or a
    chunk after a cached prefix, into the staging row), store (staging row into a prefix pool
    row), insert (staging row into a slot), resize (the slot caches to another window) and
    generate.

    The slot caches are a tuple of parts, each with its positions on one axis
    (``position_axes``): for the in-place families, per layer, keys and values in
    ``inference.forward.attention``'s layout; otherwise one array shaped like keras-hub's cache
    with a leading slot axis. Shared by every Engine with the same (slots, steps per dispatch,
    context, prefix rows and capacity), so a second engine of the same model compiles nothing
    new.
    """

    def __init__(
        self, lm: keras_hub.models.CausalLM, slots: int, steps: int, context: int, prefix_rows: int, capacity: int
    ) -> None:
        import jax
        import jax.numpy as jnp
        import keras_hub

        from inference.forward import gemma3
        from inference.forward.attention import KEY_POSITION_AXIS, VALUE_POSITION_AXIS, cache_shapes

        if not (hasattr(lm, "_build_cache") and hasattr(lm, "call_with_cache")):
            raise TypeError(f"{type(lm).__name__} has no cached decoding (_build_cache).")
        model_ref = weakref.ref(lm)  # Held in a WeakKeyDictionary keyed by the model: no cycle.
        greedy_sampler = keras_hub.samplers.GreedySampler()
        # Python bodies run only when jax traces them: traces per function, for diagnostics.
        self.traces: collections.Counter[str] = collections.Counter()

        def stateless(state: tuple[list[Any], list[Any]]) -> tuple[Any, Any]:
            return stateless_model(model_ref, state)

        def cache_spec(length: int) -> Any:
            def build(state: Any) -> Any:
                model, scope = stateless(state)
                with scope:
                    return model._build_cache(jnp.zeros((1, length), jnp.int32))[1]

            return jax.eval_shape(build, _model_state(lm))

        if gemma3.supports(lm):
            # Gemma 3's _build_cache and call_with_cache also take image inputs: it only runs
            # through its own forward pass (keras-hub's layout here: the engine lays it out).
            layers, kv_heads, head_dim, dtype = gemma3.cache_layout(lm)
            one = two = jax.ShapeDtypeStruct((1, layers, 2, 2, kv_heads, head_dim), dtype)
            length_axes = [2]
        else:
            # keras-hub caches are [1, layers, 2, length, kv_heads, head_dim]; find the length
            # axis rather than assume it, by building (abstractly) caches of two lengths.
            one, two = cache_spec(2), cache_spec(3)  # Not 1: keras warns about a softmax over 1 key.
            length_axes = [i for i, (a, b) in enumerate(zip(one.shape, two.shape, strict=True)) if a != b]
        if len(length_axes) != 1:
            raise TypeError(f"Cannot find the sequence axis of {type(lm).__name__}'s cache {one.shape}.")
        # Gemma, Gemma 3, Llama 3 and Mistral get a forward pass of the engine's own that updates
        # per-layer caches in place (inference.forward); other families go through keras-hub's
        # call_with_cache and _build_cache.
        keras_hub_layout = one.shape == (1, lm.backbone.num_layers, 2, 2, *one.shape[4:])
        decoder = _in_place_decoder(lm, context) if keras_hub_layout else None
        self.in_place = in_place = decoder is not None
        forward, prepare, self.layout = decoder or (None, None, None)
        if in_place:
            _, layers, _, _, kv_heads, head_dim = one.shape
            self.position_axes = (KEY_POSITION_AXIS, VALUE_POSITION_AXIS) * layers
        else:
            self.position_axes = (length_axes[0] + 1,)  # In keras-hub's cache after the slot axis.
        axes = self.position_axes

        def caches(rows: int, length: int) -> tuple[Any, ...]:
            """Zeroed caches of ``rows`` rows and ``length`` positions."""
            if in_place:
                key, value = cache_shapes(rows, kv_heads, head_dim, length)
                return tuple(jnp.zeros(shape, one.dtype) for _ in range(layers) for shape in (key, value))
            shape = tuple(length if i == length_axes[0] else n for i, n in enumerate(one.shape))
            return (jnp.zeros((rows, *shape), one.dtype),)

        def fitted(parts: tuple[Any, ...], length: int) -> tuple[Any, ...]:
            """Each part cut or zero-padded to ``length`` positions."""
            out = []
            for part, axis in zip(parts, axes, strict=True):
                have = part.shape[axis]
                if length <= have:
                    out.append(jax.lax.slice_in_dim(part, 0, length, axis=axis))
                else:
                    pad = [(0, 0)] * part.ndim
                    pad[axis] = (0, length - have)
                    out.append(jnp.pad(part, pad))
            return tuple(out)

        def put_row(parts: tuple[Any, ...], rows: tuple[Any, ...], index: Any) -> tuple[Any, ...]:
            """``rows`` (one row each) written into row ``index`` of ``parts``, from position 0."""
            return tuple(
                jax.lax.dynamic_update_slice(part, row, (index,) + (0,) * (part.ndim - 1))
                for part, row in zip(parts, rows, strict=True)
            )

        def init(state: Any, window: int) -> tuple[Any, ...]:
            # Takes the variables so that the arrays land on the devices they live on.
            self.traces["init"] += 1
            pool: Any = None
            weights: Any = ()
            if in_place:
                pool = caches(max(prefix_rows, 1), capacity)  # A row to read even when off.
                model, scope = stateless(state)
                with scope:
                    weights = prepare(model)
            slot_state = {
                "tokens": jnp.zeros((slots,), jnp.int32),
                "positions": jnp.zeros((slots,), jnp.int32),
                "keys": jnp.zeros((slots, 2), jnp.uint32),
                "temperature": jnp.zeros((slots,), jnp.float32),
                "top_k": jnp.zeros((slots,), jnp.int32),
                "top_p": jnp.ones((slots,), jnp.float32),
            }
            return caches(slots, window), caches(1, context), slot_state, pool, weights

        def start(slot_state: dict[str, Any], slot: Any, last: Any, length: Any, key: Any, *params: Any) -> Any:
            # The slot starts from the prompt's last token, at its own index: the first decode
            # step runs it and samples the first new token, as keras-hub's generate loop does
            # after _build_cache (so greedy output stays generate()'s).
            temperature, top_k, top_p = params
            updates = {
                "tokens": last,
                "positions": length - 1,
                "keys": key,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
            }
            return {name: value.at[slot].set(updates[name]) for name, value in slot_state.items()}

        def prefill(
            state: Any,
            staging: Any,
            slot_state: dict[str, Any],
            token_ids: Any,
            length: Any,
            slot: Any,
            temperature: Any,
            top_k: Any,
            top_p: Any,
            key: Any,
        ) -> tuple[Any, dict[str, Any]]:
            """keras-hub's own prefill (families without an in-place forward): its cache of the
            whole prompt at the start of the staging row (beyond the prompt, whatever an earlier
            request left, masked by the causal mask until overwritten)."""
            self.traces[f"prefill[{token_ids.shape[1]}]"] += 1
            model, scope = stateless(state)
            with scope:
                _, prompt_cache = model._build_cache(token_ids)
            staging = put_row(staging, (prompt_cache[None].astype(staging[0].dtype),), 0)
            last = jax.lax.dynamic_index_in_dim(token_ids[0], length - 1, keepdims=False)
            slot_state = start(slot_state, slot, last, length, key, temperature, top_k, top_p)
            return staging, slot_state

        def prefill_chunk(
            state: Any,
            weights: tuple[Any, ...],
            staging: Any,
            slot_state: dict[str, Any],
            pool: Any,
            integers: Any,
            reals: Any,
            prefix: int,
        ) -> tuple[Any, dict[str, Any]]:
            """Prefill after a cached prefix (in-place families), into the staging row.

            ``integers`` (uint32, filled by ``Engine._prefill``: one transfer instead of ten) holds
            the chunk, then ``last``, ``start``, ``length``, ``slot``, the pool row to read,
            ``top_k`` and the PRNG key; ``reals`` the temperature and top-p. The prompt's first
            positions come from the row read (its first ``start`` positions hold the prompt's
            cached prefix; 0 for none), and the chunk (the prompt's tokens after it but the
            last, padded) runs at ``start`` onwards. Its positions are then copied into the
            staging row (``insert`` takes them to the slot, ``store`` to a pool row); the slot
            starts from ``last``. ``prefix`` (static: one of ``SHORT_PREFIXES`` or the pool's capacity)
            bounds ``start``: the chunk attends over ``prefix`` + its own positions. The pool
            is only read here: a program that reads a row and writes another of the same pool
            made XLA copy the whole pool first (about 380 MB a prefill for SmolLM2).
            """
            size = integers.shape[0] - _CHUNK_FIELDS
            self.traces[f"prefill[{size}, {prefix}]"] += 1
            fields = integers[size:]
            chunk = integers[None, :size].astype(jnp.int32)
            last, begin, length, slot, read_row, top_k = (fields[i].astype(jnp.int32) for i in range(6))
            key, (temperature, top_p) = fields[6:8], (reals[0], reals[1])
            # The positions the prefill touches: the host keeps begin (at most the prefix) + size
            # within the context.
            span = min(prefix + size, context)
            kept = min(prefix, span)  # Pool positions the prefill can use.
            model, scope = stateless(state)
            with scope:
                row = tuple(jax.lax.dynamic_index_in_dim(part, read_row, axis=0) for part in pool)
                _, local = forward(model, chunk, fitted(fitted(row, kept), span), begin[None], weights)
            # Beyond the prompt, the staging row keeps padding's keys and values: masked until
            # overwritten.
            staging = put_row(staging, local, 0)
            slot_state = start(slot_state, slot, last, length, key, temperature, top_k, top_p)
            return staging, slot_state

        def store(pool: Any, staging: Any, row: Any, positions: int) -> Any:
            """The staging row's first ``positions`` positions into pool ``row``. The rest of
            the row keeps what it held: a prefill reads a row only below the prefix it
            matched, so what lies past the stored prefix is never read."""
            self.traces[f"store[{positions}]"] += 1
            return put_row(pool, fitted(staging, positions), row)

        def insert(cache: Any, staging: Any, slot: Any) -> Any:
            """The staging row's first positions (as many as the window has) into ``slot``."""
            window = cache[0].shape[axes[0]]
            self.traces[f"insert[{window}]"] += 1
            return put_row(cache, fitted(staging, window), slot)

        def resize(cache: Any, window: int) -> Any:
            """The slot caches cut or zero-padded to ``window`` positions: every running
            request's positions are below both lengths (the host resizes only then)."""
            self.traces[f"resize[{cache[0].shape[axes[0]]}->{window}]"] += 1
            return fitted(cache, window)

        def generate(
            state: Any, weights: tuple[Any, ...], cache: Any, slot_state: dict[str, Any], active: Any, count: Any
        ) -> tuple[Any, dict[str, Any], Any]:
            # `count` steps (at most `steps`): a traced bound, so that the engine can change how
            # many steps a dispatch runs without compiling anything.
            # The slot caches hold `window` positions: every active slot's positions in this
            # dispatch are below it (the host resizes them to fit), so a step costs in
            # proportion to slots x window, not slots x context.
            window = cache[0].shape[axes[0]]
            self.traces[f"generate[{window}]"] += 1
            model, scope = stateless(state)

            def one_slot(token: Any, slot_cache: Any, position: Any) -> tuple[Any, Any]:
                # Batch 1 inside, one cache index per slot outside (vmap).
                logits, _, slot_cache = model.call_with_cache(token[None, None], slot_cache, position)
                return logits[0, 0], slot_cache

            all_slots = jax.vmap(one_slot)

            def body(step: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
                cache, tokens, positions, keys, out = carry
                # Free slots keep running: clamp their index into the window (active slots are
                # below it); their writes are never read.
                clamped = jnp.minimum(positions, window - 1)
                if in_place:
                    logits, cache = forward(model, tokens[:, None], cache, clamped, weights)
                    logits = logits[:, 0]
                else:
                    logits, only = all_slots(tokens, cache[0], clamped)
                    cache = (only,)
                tokens, keys = _sample(
                    logits,
                    # A free slot keeps its last request's parameters: never let it sample.
                    jnp.where(active, slot_state["temperature"], 0.0),
                    slot_state["top_k"],
                    slot_state["top_p"],
                    keys,
                    greedy_sampler,
                )
                out = jax.lax.dynamic_update_slice(out, tokens[:, None], (0, step))
                positions = jnp.minimum(positions + 1, context)  # Bounded for free slots.
                return cache, tokens, positions, keys, out

            out = jnp.zeros((slots, steps), jnp.int32)
            carry = (cache, slot_state["tokens"], slot_state["positions"], slot_state["keys"], out)
            with scope:
                cache, tokens, positions, keys, out = jax.lax.fori_loop(0, count, body, carry)
            slot_state = {**slot_state, "tokens": tokens, "positions": positions, "keys": keys}
            return cache, slot_state, out

        self.init = jax.jit(init, static_argnums=(1,))
        # One compilation per prefill length (bucket).
        self.prefill = jax.jit(prefill, donate_argnums=(1, 2))
        # One compilation per chunk length and prefix bound (Engine._prefixes).
        self.prefill_chunk = jax.jit(prefill_chunk, donate_argnums=(2, 3), static_argnums=(7,))
        # One compilation per stored length (Engine._pool_lengths).
        self.store = jax.jit(store, donate_argnums=(0,), static_argnums=(3,))
        # One compilation per window (insert, generate) and pair of neighbouring windows
        # (resize: the engine steps through the windows between two).
        self.insert = jax.jit(insert, donate_argnums=(0,))
        self.resize = jax.jit(resize, static_argnums=(1,))
        self.generate = jax.jit(generate, donate_argnums=(2, 3))


_programs: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], _Programs]] = weakref.WeakKeyDictionary()
_programs_lock = threading.Lock()


def _programs_for(
    lm: keras_hub.models.CausalLM, slots: int, steps: int, context: int, prefix_rows: int, capacity: int
) -> _Programs:
    with _programs_lock:
        per_model = _programs.setdefault(lm, {})
        key = (slots, steps, context, prefix_rows, capacity)
        if key not in per_model:
            per_model[key] = _Programs(lm, slots, steps, context, prefix_rows, capacity)
        return per_model[key]


def default_buckets(context: int, smallest: int = MIN_BUCKET, fine_up_to: int = 0) -> tuple[int, ...]:
    """Prefill lengths: 64, 96, 128, 192, 256, 384, ... (two per octave), capped by the context;
    up to ``fine_up_to`` also every ``smallest`` tokens.

    Prefill cost grows faster than linearly with the padded length (attention), and a prefill
    shape compiles in well under a second, so two buckets per octave (at most a third of a
    prefill wasted on padding) are worth their compilations. The context itself is always one.
    With a prefix cache the chunks after a cached prefix are short: the engine starts them at
    16 and passes ``FINE_BUCKETS_UP_TO`` as ``fine_up_to``.
    """
    coarse = _lengths(context, smallest, three_halves_from=smallest)
    fine = range(smallest, min(fine_up_to, context) + 1, smallest)
    return tuple(sorted({*coarse, *fine}))


# From this window up, a window also between each power of two and the next (384, 768, ...):
# there a step's attention is a sizeable part of it. SmolLM2, 8 slots, a decode step over 256,
# 384 and 512 positions: 67, 76 and 81 ms (scratch timing); a chat's prompt and reply often
# end between 256 and 384 positions.
THREE_HALVES_WINDOWS_FROM = 256


def default_windows(context: int) -> tuple[int, ...]:
    """Decode windows: powers of two from 64, with 1.5 times each from
    ``THREE_HALVES_WINDOWS_FROM`` on, and the context (see ``Engine``)."""
    return _lengths(context, MIN_BUCKET, three_halves_from=THREE_HALVES_WINDOWS_FROM)


def _lengths(context: int, smallest: int, three_halves_from: int) -> tuple[int, ...]:
    """Powers of two times ``smallest`` below the context, each from ``three_halves_from`` on
    followed by 1.5 times it (when below the context), and the context."""
    lengths = []
    length = smallest
    while length < context:
        lengths.append(length)
        if length >= three_halves_from and length * 3 // 2 < context:
            lengths.append(length * 3 // 2)
        length *= 2
    return (*lengths, context)


def _sizes(name: str, sizes: Sequence[int] | None, default: tuple[int, ...], context: int) -> tuple[int, ...]:
    if sizes is None:
        return default
    if any(not isinstance(n, int) or n < 1 or n > context for n in sizes):
        raise ValueError(f"{name} must be integers within 1..{context}, got {list(sizes)}.")
    return tuple(sorted({*sizes, context}))  # The context always: every request fits.


# --- The engine -------------------------------------------------------------------------------


class Engine:
    """A continuous-batching generation engine for one keras-hub CausalLM (see module docstring).

    ``slots``: requests decoded together (more wait in a queue). ``buckets``: padded prompt
    lengths for prefill (default ``default_buckets``). ``windows``: how much of the cache a
    decode step attends over, the smallest that holds every running request's positions
    (default ``default_windows``). The context length is always added to both, so every prompt
    that leaves room for one new token is served. ``steps_per_dispatch``: tokens per slot per
    jitted call, at most (default: adaptive, see ``DISPATCH_TARGET_S``). Each bucket and each
    window is one compilation, all done by ``warm_up()``.

    ``prefix_cache_rows`` prompt prefixes of up to ``prefix_cache_tokens`` tokens (default half
    the context, at most 1024) are kept on the device (see ``inference.prefix_cache``): a prompt
    that starts like a recent one (same template and system prompt, or the same dialog one turn
    later) is prefilled from where the cached prefix ends. 0 rows turns it off; families without
    an in-place forward pass (see ``_in_place_decoder``) always prefill whole prompts.

    Use it as a context manager or call ``shutdown()``; the decode thread starts on ``start()``,
    ``warm_up()`` or the first ``submit()``. All public methods are thread-safe.
    """

    def __init__(
        self,
        lm: keras_hub.models.CausalLM,
        *,
        slots: int = 8,
        buckets: Sequence[int] | None = None,
        windows: Sequence[int] | None = None,
        steps_per_dispatch: int | None = None,
        prefix_cache_rows: int = DEFAULT_PREFIX_CACHE_ROWS,
        prefix_cache_tokens: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}.")
        if steps_per_dispatch is not None and steps_per_dispatch < 1:
            raise ValueError(f"steps_per_dispatch must be at least 1, got {steps_per_dispatch}.")
        self.lm = lm
        self.slots = slots
        self.max_steps_per_dispatch = steps_per_dispatch or DEFAULT_STEPS_PER_DISPATCH
        # Fixed if given, else the fewest steps that last DISPATCH_TARGET_S, once measured.
        self.steps_per_dispatch = self.max_steps_per_dispatch
        self._adaptive = steps_per_dispatch is None
        self._step_s: float | None = None  # Measured duration of one decode step (moving average).
        self._last_done: float | None = None  # When the host last saw a dispatch end.
        if prefix_cache_rows < 0:
            raise ValueError(f"prefix_cache_rows must be at least 0, got {prefix_cache_rows}.")
        self.context_length = context_length(lm)
        context = self.context_length
        capacity = min(context // 2, 1024) if prefix_cache_tokens is None else prefix_cache_tokens
        if not PREFIX_BLOCK <= capacity <= context // 2:
            raise ValueError(f"prefix_cache_tokens must be within {PREFIX_BLOCK}..{context // 2}, got {capacity}.")
        capacity -= capacity % PREFIX_BLOCK
        self._programs = _programs_for(lm, slots, self.max_steps_per_dispatch, context, prefix_cache_rows, capacity)
        self.in_place = self._programs.in_place
        self.prefix_cache = PrefixCache(prefix_cache_rows if self.in_place else 0, capacity, PREFIX_BLOCK)
        smallest = PREFIX_BLOCK if self.in_place else MIN_BUCKET
        fine_up_to = FINE_BUCKETS_UP_TO if self.in_place else 0
        self.buckets = _sizes("buckets", buckets, default_buckets(context, smallest, fine_up_to), context)
        self.windows = _sizes("windows", windows, default_windows(context), context)
        self._tokenizer = lm.preprocessor.tokenizer
        pad = getattr(self._tokenizer, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else 0
        _install_compile_listener()
        self._compilations = 0
        # Most requests decoded together so far: shows that concurrent callers shared a batch.
        self.peak_active_slots = 0

        self._cond = threading.Condition()
        self._pending: collections.deque[Request] = collections.deque()
        self._jobs: collections.deque[_WarmUp | _StepTiming] = collections.deque()
        self._slots: list[Request | None] = [None] * slots
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._device: _DeviceState | None = None
        self._window = self.windows[0]  # Positions the slot caches hold now (one of the windows).
        # Small per-dispatch arguments already on the device, re-sent only when they change:
        # a NumPy argument costs a host-to-device transfer on every call (~70 us a dispatch).
        self._inputs: dict[Any, Any] = {}
        self._freed = 0  # Slots freed in the current loop iteration.

    # --- Public API -------------------------------------------------------------------------

    @property
    def forward_layout(self) -> str | None:
        """The Llama pass's layout, "token-major" or "feature-major" (timed when the engine's
        programs were built: ``inference.forward.llama.faster_layout``); None for the others."""
        return self._programs.layout

    @property
    def compilations(self) -> int:
        """XLA compilations this engine has caused (its decode thread), warm-up included."""
        return self._compilations

    @property
    def active_slots(self) -> int:
        """Slots holding a running request."""
        return sum(r is not None for r in self._slots)

    @property
    def free_slots(self) -> int:
        """Slots a queued request can be prefilled into."""
        return self.slots - self.active_slots

    @property
    def queued(self) -> int:
        """Submitted requests waiting for a free slot."""
        return len(self._pending)

    def start(self) -> Engine:
        """Start the decode thread (idempotent); submit() and warm_up() call it themselves."""
        with self._cond:
            self._check_open()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
                self._thread.start()
        return self

    def warm_up(self, timeout: float | None = None) -> None:
        """Compile every prefill bucket (with its insert) and the generate step for every window.

        Blocks until done. It runs on an idle engine: requests submitted meanwhile wait, and
        running ones finish first. Call it once at start, before traffic.
        """
        self._run_job(_WarmUp(self.buckets, self.windows), "Warm-up", timeout)

    def decode_step_seconds(self, window: int, seconds: float = 3.0, timeout: float | None = None) -> float:
        """The best duration of one decode step with every slot busy, attending over the
        smallest compiled window that holds ``window`` positions: what a token of each slot
        costs when no prefill runs and no slot idles (benchmarks report it beside the real
        throughput). Runs like ``warm_up()``, on an idle engine, with dummy slots, for about
        ``seconds``; call it after ``warm_up()`` (else it compiles the step it times).
        """
        if window < 1 or seconds <= 0:
            raise ValueError("window and seconds must be positive.")
        job = _StepTiming(next((w for w in self.windows if w >= window), self.context_length), seconds)
        self._run_job(job, "Step timing", timeout)
        assert job.step_s is not None
        return job.step_s

    def _run_job(self, job: _WarmUp | _StepTiming, name: str, timeout: float | None) -> None:
        """Queue ``job`` for the decode thread (it runs on an idle engine) and wait for it."""
        with self._cond:
            self._check_open()
            self._jobs.append(job)
            self._cond.notify_all()
        self.start()
        if not job.done.wait(timeout):
            raise TimeoutError(f"{name} did not finish within {timeout} s.")
        if job.error is not None:
            raise EngineError(f"{name} failed: {job.error!r}") from job.error

    def prompt_tokens(self, prompt: str) -> int:
        """How many tokens ``prompt`` takes in this model's context (as ``submit`` encodes it)."""
        return len(encode_prompt(self.lm, prompt))

    def submit(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop_strings: Sequence[str] = (),
        sampling: SamplingParams = GREEDY,
        ignore_stop_tokens: bool = False,
    ) -> Request:
        """Queue a generation; iterate the returned Request for its text deltas.

        ``stop_strings`` that are single tokens stop on the token, and every stop string is also
        matched in the text; neither appears in the output. The tokenizer's end token(s) always
        stop. ``ignore_stop_tokens`` makes no token stop the generation (stop strings still cut
        and end the text): benchmarks use it to generate exactly ``max_new_tokens``. The reply is
        capped by the context (``Request.max_new_tokens`` is the effective limit). Raises
        ValueError for an invalid request (nothing is queued), EngineClosedError after
        ``shutdown()`` and EngineError if the decode thread died.
        """
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("The prompt is empty.")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}.")
        if isinstance(stop_strings, str):
            raise ValueError("stop_strings must be a sequence of strings, not one string.")
        if not all(isinstance(stop, str) and stop for stop in stop_strings):
            raise ValueError("Stop strings must be non-empty strings.")
        prompt_ids = encode_prompt(self.lm, prompt)
        limit = self.context_length
        if len(prompt_ids) + 1 > limit:
            raise ValueError(
                f"The prompt is {len(prompt_ids)} tokens long but the model's context is {limit} tokens: "
                "it must leave room for at least one new token."
            )
        stop_ids = frozenset() if ignore_stop_tokens else stop_token_ids(self._tokenizer, stop_strings)
        request = Request(
            prompt_ids=prompt_ids,
            max_new_tokens=min(max_new_tokens, limit - len(prompt_ids)),
            sampling=sampling,
            stop_ids=stop_ids,
            text=IncrementalText(self._tokenizer, stop_strings),
            wake=self._wake,
        )
        with self._cond:
            self._check_open()
            self._pending.append(request)
            self._cond.notify_all()
        self.start()
        return request

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the decode thread; running and queued requests end as "cancelled". Idempotent."""
        with self._cond:
            self._closing = True
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        else:
            self._end_all("cancelled")

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # --- Internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("The engine has been shut down; it accepts no more requests.")
        if self._failure is not None:
            raise EngineError(f"The engine's decode loop died: {self._failure!r}") from self._failure

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _end_all(self, reason: EngineStopReason, error: BaseException | None = None) -> None:
        with self._cond:
            pending = list(self._pending)
            self._pending.clear()
            jobs = list(self._jobs)
            self._jobs.clear()
        for slot, request in enumerate(self._slots):
            if request is not None:
                self._slots[slot] = None
                request._end(reason, error)
        for request in pending:
            request._end(reason, error)
        for job in jobs:
            job.error = error or EngineClosedError("The engine was shut down.")
            job.done.set()

    def _reset_device(self) -> None:
        state = _model_state(self.lm)
        self._window = self.windows[0]
        self._device = _DeviceState(state, *self._programs.init(state, self._window))
        self.prefix_cache.clear()

    def _run(self) -> None:
        """The decode thread: admit, dispatch, process, until shutdown."""
        _compile_owner.engine = self
        try:
            self._reset_device()
            in_flight: _Dispatch | None = None
            while True:
                with self._cond:
                    while not (
                        self._closing
                        or self._pending
                        or self._jobs
                        or in_flight is not None
                        or any(r is not None for r in self._slots)
                    ):
                        self._cond.wait()
                    if self._closing:
                        break
                    cancelled = [r for r in self._pending if r._cancel_requested]
                    for request in cancelled:
                        self._pending.remove(request)
                    free = [i for i, r in enumerate(self._slots) if r is None]
                    idle = in_flight is None and len(free) == self.slots
                    jobs: list[_WarmUp | _StepTiming] = []
                    admitted: list[Request] = []
                    if self._jobs and idle:
                        jobs = list(self._jobs)
                        self._jobs.clear()
                    # A queued warm-up runs on an idle engine (its dummy steps must not touch a
                    # running request): until then admit nothing and let the slots drain.
                    if not self._jobs:
                        admitted = [self._pending.popleft() for _ in range(min(len(free), len(self._pending)))]
                for request in cancelled:
                    request._end("cancelled")
                try:
                    self._freed = 0
                    in_flight = self._iterate(admitted, free, jobs, in_flight)
                    if self._freed and in_flight is not None:
                        self._await_resubmission()
                except Exception as exc:  # Fail what was running, keep serving the queue.
                    logger.exception("Engine decode step failed")
                    in_flight = None
                    for job in jobs:
                        if not job.done.is_set():
                            job.error = exc
                            job.done.set()
                    for slot, request in enumerate(self._slots):
                        if request is not None:
                            self._slots[slot] = None
                            request._end("error", exc)
                    for request in admitted:
                        request._end("error", exc)
                    self._reset_device()  # Donated buffers may be gone: start from fresh ones.
        except BaseException as exc:
            with self._cond:
                self._failure = exc
            logger.exception("Engine decode thread died")
            self._end_all("error", exc)
            raise
        else:
            self._end_all("cancelled")
        finally:
            _compile_owner.engine = None

    def _iterate(
        self,
        admitted: list[Request],
        free: list[int],
        jobs: list[_WarmUp | _StepTiming],
        in_flight: _Dispatch | None,
    ) -> _Dispatch | None:
        """One loop iteration; returns the dispatch whose tokens are not processed yet."""
        for job in jobs:  # On an idle engine, with dummy inputs.
            if isinstance(job, _WarmUp):
                self._warm_up(job)
            else:
                self._time_steps(job)

        for request, slot in zip(admitted, free, strict=False):
            self._slots[slot] = request
            self.peak_active_slots = max(self.peak_active_slots, self.active_slots)
            request._slot = slot
            # Index of the next step: the first one runs the prompt's last token.
            request._position = len(request.prompt_ids) - 1
        owners = tuple(self._slots)
        running = [r for r in owners if r is not None]
        count = self.steps_per_dispatch
        resized = False
        if running:
            # The smallest window that holds every position this dispatch writes.
            needed = max(r._position for r in running) + count
            resized = self._resize(next((w for w in self.windows if w >= needed), self.context_length))
        for request in admitted:
            assert request._slot is not None
            self._prefill(request.prompt_ids, request._slot, request.sampling)
            self._insert(request._slot)

        dispatched = None
        if running:
            for request in running:
                request._position += count
            out = self._generate(self._input(tuple(r is not None for r in owners), np.bool_), count)
            dispatched = _Dispatch(out, owners, count, time.perf_counter(), timed=not (admitted or resized))

        # Host work below overlaps the dispatched step (JAX dispatches asynchronously).
        if in_flight is not None:
            self._process(in_flight)
        return dispatched

    def _warm_up(self, job: _WarmUp) -> None:
        """Compile every shape, on an idle engine, with dummy inputs: each prefill bucket, then
        for each window (ascending) the resize to it, an insert and a decode step, then the
        resizes back down."""
        inactive = self._input((False,) * self.slots, np.bool_)
        for bucket in job.buckets:
            for prefix in self._prefixes(bucket):
                self._prefill([self._pad_id, self._pad_id], 0, GREEDY, bucket=bucket, prefix=prefix)
        device = self._device
        assert device is not None
        if self.prefix_cache.entries:
            for positions in self._pool_lengths():
                device.pool = self._programs.store(device.pool, device.staging, np.int32(0), positions)
            self.prefix_cache.clear()  # Pool row 0 now holds the dummy prefill.
        for window in job.windows:
            self._resize(window)
            self._insert(0)
            np.asarray(self._generate(inactive, self.steps_per_dispatch))
        self._resize(job.windows[0])
        job.done.set()

    def _time_steps(self, job: _StepTiming) -> None:
        """Dispatch one decode step of every slot at a time, each waited for, for about
        ``job.seconds`` (at least three), at ``job.window``; keep the best step's duration."""
        busy = self._input((True,) * self.slots, np.bool_)
        self._resize(job.window)
        np.asarray(self._generate(busy, 1))  # The first after a resize may pay for it.
        durations: list[float] = []
        began = time.perf_counter()
        while len(durations) < 3 or time.perf_counter() - began < job.seconds:
            started = time.perf_counter()
            np.asarray(self._generate(busy, 1))
            durations.append(time.perf_counter() - started)
        self._resize(self.windows[0])
        job.step_s = min(durations)
        job.done.set()

    def _resize(self, window: int) -> bool:
        """Bring the slot caches to ``window`` positions, one neighbouring window at a time (so
        that each pair compiles once), keeping every running request's positions; whether
        anything was dispatched."""
        device = self._device
        assert device is not None
        levels = self.windows
        resized = self._window != window
        while self._window != window:
            index = levels.index(self._window)
            self._window = levels[index + 1] if window > self._window else levels[index - 1]
            device.cache = self._programs.resize(device.cache, self._window)
        return resized

    def _insert(self, slot: int) -> None:
        """Dispatch the copy of the staging row (the last prefill) into ``slot``."""
        device = self._device
        assert device is not None
        device.cache = self._programs.insert(device.cache, device.staging, np.int32(slot))

    def _generate(self, active: Any, count: int) -> Any:
        """Dispatch ``count`` decode steps of every slot; returns their tokens [slots, steps] (on
        the device; the first ``count`` columns)."""
        device = self._device
        assert device is not None
        device.cache, device.slot_state, out = self._programs.generate(
            device.state, device.weights, device.cache, device.slot_state, active, self._input(count, np.int32)
        )
        return out

    def _pool_lengths(self) -> tuple[int, ...]:
        """The prefix lengths compiled for: ``SHORT_PREFIXES`` and a whole pool row."""
        capacity = self.prefix_cache.capacity  # Positions of a prefix pool row.
        return tuple(sorted({min(short, capacity) for short in SHORT_PREFIXES} | {capacity}))

    def _prefixes(self, size: int) -> tuple[int, ...]:
        """The prefix lengths a chunk of ``size`` tokens is compiled for (see SHORT_PREFIXES)."""
        lengths = self._pool_lengths()
        return lengths if size <= max(SHORT_PREFIXES) else lengths[-1:]

    def _prefill(
        self,
        prompt_ids: list[int],
        slot: int,
        sampling: SamplingParams,
        bucket: int | None = None,
        prefix: int | None = None,
    ) -> None:
        """Dispatch the prefill of a prompt's keys and values (all but its last token's) into
        the staging row, and start ``slot`` from its last token; ``_insert`` then copies the
        staging row to the slot, and the slot's first decode step gives the first new token.

        In-place families start from the longest cached prefix (leaving at least the last
        token to run) and keep the prompt's prefix for later prompts. ``bucket`` and ``prefix``
        force a compiled shape (warm-up: a two-token prompt, nothing cached).
        """
        programs = self._programs
        device = self._device
        assert device is not None
        length = len(prompt_ids)
        params = _slot_params(sampling)
        if not self.in_place:
            bucket = bucket or next(b for b in self.buckets if b >= length)
            token_ids = np.full((1, bucket), self._pad_id, dtype=np.int32)
            token_ids[0, :length] = prompt_ids
            device.staging, device.slot_state = programs.prefill(
                device.state, device.staging, device.slot_state, token_ids, np.int32(length), np.int32(slot), *params
            )
            return
        match = NO_MATCH if bucket else self.prefix_cache.lookup(prompt_ids, limit=length - 1)
        size = bucket or next(b for b in self.buckets if b >= max(length - 1 - match.length, 1))
        if match.length + size > self.context_length:  # The chunk would not fit after the prefix.
            match = NO_MATCH
            size = next(b for b in self.buckets if b >= max(length - 1, 1))
        # The prefill computes every position but the last token's: only those can be kept.
        row = None if bucket else self.prefix_cache.store(prompt_ids[:-1], match)
        integers = np.full(size + _CHUNK_FIELDS, self._pad_id, dtype=np.uint32)
        integers[: length - 1 - match.length] = prompt_ids[match.length : length - 1]
        temperature, top_k, top_p, key = params
        integers[size:] = (prompt_ids[-1], match.length, length, slot, match.entry, top_k, *key)
        prefix = prefix or next(p for p in self._prefixes(size) if p >= match.length)
        device.staging, device.slot_state = programs.prefill_chunk(
            device.state,
            device.weights,
            device.staging,
            device.slot_state,
            device.pool,
            integers,
            np.array([temperature, top_p], dtype=np.float32),
            prefix,
        )
        if row is not None:
            # Only the prefix's positions: a whole pool row's copy took 15 ms a prompt (SmolLM2,
            # 1024 positions) where the prompt needed a quarter of it.
            stored = min(length - 1, self.prefix_cache.capacity)
            positions = next(p for p in self._pool_lengths() if p >= stored)
            device.pool = programs.store(device.pool, device.staging, np.int32(row), positions)

    def _input(self, value: Any, dtype: type) -> Any:
        """``value`` as a device array, kept for reuse (a step count, the last active mask)."""
        key = (dtype, value)
        array = self._inputs.get(key)
        if array is None:
            import jax

            if len(self._inputs) > 64:  # Masks come and go with requests: keep a few.
                self._inputs.clear()
            # Not committed to a device, like a NumPy argument: fine with sharded variables.
            array = self._inputs[key] = jax.device_put(np.asarray(value, dtype=dtype))
        return array

    def _process(self, dispatch: _Dispatch) -> None:
        # The one device-to-host read of a dispatch.
        rows = np.asarray(dispatch.tokens)[:, : dispatch.count].tolist()
        done = time.perf_counter()
        if dispatch.timed and self._adaptive:
            # The device ran it after the previous dispatch, or from when it was sent.
            began = max(dispatch.dispatched_at, self._last_done or 0.0)
            self._measured_step((done - began) / dispatch.count)
        self._last_done = done
        for row, request in zip(rows, dispatch.owners, strict=True):
            if request is None or request._finished.is_set():
                continue  # A free slot, or a request that ended after this dispatch started.
            if request._cancel_requested:
                self._release(request)
                request._end("cancelled")
                continue
            self._accept(request, row)

    def _measured_step(self, seconds: float) -> None:
        """Take one measured step duration: the moving average sets the steps per dispatch."""
        self._step_s = seconds if self._step_s is None else 0.7 * self._step_s + 0.3 * seconds
        wanted = math.ceil(DISPATCH_TARGET_S / max(self._step_s, 1e-6))
        self.steps_per_dispatch = max(1, min(self.max_steps_per_dispatch, wanted))

    def _accept(self, request: Request, token_ids: Sequence[int]) -> None:
        """Take a slot's new tokens: stop, limit, text; end the request when it is done."""
        if request.stats.ttft_s is None:
            request.stats.ttft_s = time.perf_counter() - request._submitted
        accepted: list[int] = []
        reason: EngineStopReason | None = None
        room = request.max_new_tokens - len(request.token_ids)
        for token_id in token_ids:
            if token_id in request._stop_ids:
                reason = "stop"
                break
            accepted.append(token_id)
            if len(accepted) >= room:
                reason = "length"
                break
        if accepted:
            delta = request._text.add(accepted)
            if delta:
                request._emit(delta)
            if request._text.stopped:
                reason = "stop"
        if reason is None and request._cancel_requested:
            reason = "cancelled"
        if reason is not None:
            self._release(request)
            request._end(reason)

    def _release(self, request: Request) -> None:
        if request._slot is not None and self._slots[request._slot] is request:
            self._slots[request._slot] = None
            self._freed += 1

    def _await_resubmission(self) -> None:
        """Give the readers of requests that just ended a moment to submit their next one.

        A caller often submits its next request as soon as one ends (the next turn of a
        dialog, a worker's next task); without this it would only be seen after the dispatch
        that is already queued, so its slot would sit idle for one more dispatch. The wait
        costs no device time: it ends well before the dispatch in flight does.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._pending or self._jobs or self._closing, timeout=RESUBMIT_GRACE_S)


# After the chunk in prefill_chunk's integer argument: last, start, length, slot, the pool row
# read, top_k and the two words of the PRNG key.
_CHUNK_FIELDS = 8


def _slot_params(sampling: SamplingParams) -> tuple[Any, ...]:
    """Per-request prefill arguments as NumPy scalars: fixed dtypes, never a recompilation."""
    seed = int(sampling.seed)
    key = np.array([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)  # As jax.random.PRNGKey.
    return (
        np.float32(sampling.temperature),
        np.int32(min(sampling.top_k, 2**31 - 1)),
        np.float32(sampling.top_p),
        key,
    )
