"""Continuous batching for keras-hub causal LMs on JAX: many streams share one decode step.

``inference.streaming`` decodes one request at a time; much of each step is fixed overhead
(Python, dispatch, per-op costs, reading the weights), so serving requests one after another
wastes the machine. This engine follows JetStream's design (see shared/facts.md):

* a fixed number of decode **slots**, each with its own key/value cache of the model's full
  context length: one array shaped like keras-hub's cache with a leading slot axis,
  ``[slots, 1, layers, 2, context, kv_heads, head_dim]``, or, for the families with an
  in-place step (below), per layer, separate key and value arrays;
* **prefill** runs each new request alone (batch 1, prompt padded to a length bucket) with the
  model's own ``_build_cache``, then, as keras-hub's ``generate_step`` does, runs the last
  prompt token again at its own index with ``call_with_cache`` and samples the first new token
  from it (so greedy output stays exactly ``generate()``'s), and **inserts** the prompt's cache,
  the first token, its position, the sampling parameters and the advanced PRNG key into a free
  slot, all in one jitted function (one compilation per bucket). The first token reaches the
  reader right after prefill, without waiting for a decode step;
* one jitted **generate** step advances *every* slot by ``steps_per_dispatch`` tokens
  (``lax.fori_loop``). Slots sit at different positions, while keras-hub's
  ``call_with_cache`` takes one ``cache_update_index`` for the whole batch, so the step
  ``jax.vmap``s a batch-1 ``call_with_cache`` over the slot axis with a per-slot index: the
  cache write (``dynamic_update_slice``, a scatter under vmap), the rotary position and the
  causal mask all accept a traced per-slot index. Free slots compute too (the shape is fixed);
  their output is ignored and their index is clamped into the cache;
* **Gemma, Llama 3 and Mistral** models get a step of the engine's own instead
  (``_gemma_decode_step``, ``_llama_decode_step``; ``_in_place_decoder`` says when it applies):
  the same computation with the model's own layers, but each layer's keys and values are
  separate arrays updated in place. keras-hub's cached attention slices the layer out of one
  stacked cache, updates and restacks it at every token, which on a CPU costs more than the
  arithmetic (measured, 8 slots, a 256-position window: the strong Gemma model 2.1 ms a step
  through ``call_with_cache``, 0.55 ms in place; the 2-layer Mistral model 0.67 ms, 0.45 ms);
* the step attends over a **window** of the cache, the smallest of a few lengths (powers of
  two) that holds every running request's positions during the dispatch, copied out of the
  cache at the start of a dispatch and written back at its end (with the in-place step, only
  the positions the dispatch wrote), so a step costs in proportion to slots x window, not
  slots x context;
* a slot is freed on a stop token, its token limit, the end of the context, or cancellation,
  and the next queued request is prefilled into it at the next iteration.

A background **decode thread** owns all device state and runs the loop; ``submit()`` can be
called from any number of threads and returns a ``Request`` whose iteration yields text deltas
as the decode thread produces them. Per dispatch the host reads the new tokens once
(``np.asarray``) and dispatches the next step *before* turning the previous tokens into text,
so detokenisation overlaps the device work (JAX dispatches asynchronously); a slot freed by
that processing simply has one wasted dispatch. Cache and slot arrays are donated to every
jitted call, so they are updated in place.

Sampling happens inside the jitted step with per-slot parameter arrays, so mixed requests share
one compiled step: greedy (temperature 0: the same float32 softmax + argmax as keras-hub's
``GreedySampler``, so greedy output equals ``generate()``), temperature, top-k and top-p, with
a per-slot PRNG key derived from the request's seed and split once per token (same seed and
prompt, same text, whatever else is in the batch). The sort that top-k/top-p need only runs
when some running slot samples (``lax.cond`` on the batch).

Compilations: ``warm_up()`` compiles every prefill bucket and every decode window; after it, no
request compiles anything. ``Engine.compilations`` counts XLA compilations done on the
engine's thread (a ``jax.monitoring`` listener), so a benchmark can show that none happen after
warm-up. Compiled functions are shared by engines of the same model, slot count and steps.

The model variables are passed to the jitted functions as arguments (stateless, as
``generate()`` does), so variables sharded with ``keras.distribution`` keep their shardings,
and the caches are created by a jitted function of the variables, on their devices.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import collections
import logging
import math
import numbers
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

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

# Measured with the strong demo model (bench_engine, 2 CPU cores, 8 concurrent requests): 8 tokens
# per dispatch gave 5276 tokens/s against 4245 with 4 and 5063 with 16; a newly submitted
# request waits at most one dispatch for its prefill, which also yields its first token.
DEFAULT_STEPS_PER_DISPATCH = 8
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
        bucket: int,
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
        self._bucket = bucket
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
        while not self._drained:
            item = self._deltas.get()
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


# A dispatched generate step: its token array [slots, steps], the slot owners when it was
# dispatched, and how many of its steps ran.
_Dispatch = tuple[Any, tuple[Request | None, ...], int]


@dataclass
class _WarmUp:
    """A warm-up job for the decode thread; the caller waits on ``done``."""

    buckets: tuple[int, ...]
    windows: tuple[int, ...]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


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
    import keras

    # Exactly GreedySampler's float32 softmax + argmax, so that near-ties resolve as generate().
    probabilities = greedy_sampler.compute_probabilities(logits)
    greedy = keras.ops.cast(greedy_sampler.get_next_token(probabilities), "int32")

    def split(key: Any) -> Any:
        return jax.random.key_data(jax.random.split(jax.random.wrap_key_data(key, impl=_KEY_IMPL)))

    pairs = jax.vmap(split)(keys)  # One split per token and slot: reproducible per request.
    keys, subkeys = pairs[:, 0], pairs[:, 1]
    sampling = temperature > 0

    def sampled() -> Any:
        scaled = logits.astype(jnp.float32) / jnp.where(sampling, temperature, 1.0)[:, None]
        vocabulary = scaled.shape[-1]
        descending = -jnp.sort(-scaled, axis=-1)
        rank = jnp.arange(vocabulary)[None, :]
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

        return jax.vmap(draw)(subkeys, filtered).astype(jnp.int32)

    # A real branch (not a select): all-greedy batches skip the sort.
    drawn = jax.lax.cond(jnp.any(sampling), sampled, lambda: greedy)
    return jnp.where(sampling, drawn, greedy), keys


def _in_place_decoder(lm: Any, context: int) -> tuple[Callable[..., Any], bool] | None:
    """The engine's own decode step for ``lm`` and whether its caches are heads-first, or None.

    Only where the step computes exactly what ``lm.call_with_cache`` does: Gemma without
    sliding windows or soft caps (``_gemma_decode_step``, caches ``[slots, kv_heads, positions,
    head_dim]``), and Llama 3 / Mistral decoders whose sliding window, if any, covers
    the context (``_llama_decode_step``, caches ``[slots, positions, kv_heads, head_dim]``, the
    layout their attention's own ``_compute_attention`` takes).
    """
    import keras_hub

    backbone = lm.backbone
    blocks = backbone.transformer_layers
    if type(lm) is keras_hub.models.GemmaCausalLM and type(backbone) is keras_hub.models.GemmaBackbone:
        if all(
            not block.attention.use_sliding_window_attention
            and block.attention.logit_soft_cap is None
            and not block.dropout
            for block in blocks
        ):
            return _gemma_decode_step, True
        return None
    # Vicuna (LlamaCausalLM) has the same blocks but no engine test yet: it keeps the generic step.
    llama_like = (keras_hub.models.Llama3CausalLM, keras_hub.models.MistralCausalLM)
    if type(lm) in llama_like and type(backbone) in (keras_hub.models.Llama3Backbone, keras_hub.models.MistralBackbone):
        window = getattr(backbone, "sliding_window", None)
        if (window is None or window >= context) and not getattr(backbone, "dropout", 0):
            return _llama_decode_step, False
    return None


def _layer_caches(cache: Any, heads_first: bool) -> tuple[Any, ...]:
    """keras-hub caches ``[slots, 1, layers, 2, length, kv_heads, head_dim]`` as a flat tuple
    (keys, values, per layer) of ``[slots, length, kv_heads, head_dim]`` arrays, or of
    ``[slots, kv_heads, length, head_dim]`` ones if ``heads_first``."""
    import jax.numpy as jnp

    parts = (cache[:, 0, layer, kind] for layer in range(cache.shape[2]) for kind in (0, 1))
    return tuple(jnp.swapaxes(part, 1, 2) if heads_first else part for part in parts)


def _gemma_decode_step(model: Any, tokens: Any, caches: tuple[Any, ...], positions: Any) -> tuple[Any, tuple[Any, ...]]:
    """One token for every slot of a Gemma model, each at its own position; traced in jit.

    The same computation as ``GemmaCausalLM.call_with_cache`` (embedding scaled by
    sqrt(hidden), per block: pre-attention norm, rotary query and key, attention over the cache
    up to the slot's position, output projection, gated feed-forward; final norm, tied
    logits), calling the model's own layers for everything but the cache. keras-hub's layers
    slice the keys and values out of one stacked cache, update and restack it for every token,
    which on a CPU costs more than the arithmetic; here each layer's keys and values are
    separate arrays laid out ``[slots, kv_heads, positions, head_dim]``, written in place.
    """
    import jax
    import jax.numpy as jnp
    import keras
    from keras import ops

    backbone = model.backbone
    x = backbone.token_embedding(tokens[:, None])
    x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    slots = tokens.shape[0]
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block.attention
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:
            return jax.vmap(lambda row, position: attention._apply_rope(row[None], position)[0])(t, positions)

        normalized = block.pre_attention_norm(x)
        query = rope(attention.query_dense(normalized))  # [slots, 1, heads, head_dim]
        key = rope(attention.key_dense(normalized))  # [slots, 1, kv_heads, head_dim]
        value = attention.value_dense(normalized)

        def write(cache: Any, update: Any, position: Any) -> Any:
            return jax.lax.dynamic_update_slice(cache, jnp.swapaxes(update, 0, 1), (0, position, 0))

        keys = jax.vmap(write)(keys, key, positions)
        values = jax.vmap(write)(values, value, positions)
        updated += [keys, values]

        # GemmaAttention._compute_attention, with the cache's heads-first layout.
        if attention.query_head_dim_normalize:
            normalization = 1 / np.sqrt(attention.head_dim)
        else:
            normalization = 1 / np.sqrt(attention.hidden_dim // attention.num_query_heads)
        query = query * ops.cast(normalization, query.dtype)
        groups = attention.num_query_heads // attention.num_key_value_heads
        query = ops.reshape(query, (slots, 1, attention.num_key_value_heads, groups, attention.head_dim))
        logits = jnp.einsum("btkgh,bksh->bkgts", query, keys)
        mask = (jnp.arange(keys.shape[2])[None, :] <= positions[:, None])[:, None, None, None, :]
        probabilities = ops.cast(attention.softmax(logits, mask=mask), logits.dtype)
        attended = jnp.einsum("bkgts,bksh->btkgh", probabilities, values)
        attended = ops.reshape(attended, (slots, 1, attention.num_query_heads, attention.head_dim))
        attended = attention.output_dense(attended)

        if block.use_post_attention_norm:
            attended = block.post_attention_norm(attended)
        attention_x = x + attended
        normalized = block.pre_ffw_norm(attention_x)
        hidden = keras.activations.gelu(block.gating_ffw(normalized), approximate=True) * block.gating_ffw_2(normalized)
        hidden = block.ffw_linear(hidden)
        if block.use_post_ffw_norm:
            hidden = block.post_ffw_norm(hidden)
        x = hidden + attention_x
    x = backbone.layer_norm(x)
    logits = backbone.token_embedding(x, reverse=True)
    return logits[:, 0], tuple(updated)


def _llama_decode_step(model: Any, tokens: Any, caches: tuple[Any, ...], positions: Any) -> tuple[Any, tuple[Any, ...]]:
    """One token for every slot of a Llama 3 or Mistral model, each at its own position.

    ``call_with_cache`` of those families, block by block, with the model's own layers
    (including the attention's own ``_compute_attention``, so the arithmetic is the same), but
    each layer's keys and values are separate ``[slots, positions, kv_heads, head_dim]`` arrays
    written in place (see ``_gemma_decode_step``).
    """
    import jax
    import jax.numpy as jnp
    from keras import ops

    backbone = model.backbone
    x = backbone.token_embedding(tokens[:, None])
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block._self_attention_layer
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:
            def one(row: Any, position: Any) -> Any:
                return attention.rotary_embedding_layer(row[None], start_index=position)[0]

            return jax.vmap(one)(t, positions)

        residual = x
        normalized = block._self_attention_layernorm(x)
        query = rope(attention._query_dense(normalized))
        key = rope(attention._key_dense(normalized))
        value = attention._value_dense(normalized)

        def write(cache: Any, update: Any, position: Any) -> Any:
            return jax.lax.dynamic_update_slice(cache, update, (position, 0, 0))

        keys = jax.vmap(write)(keys, key, positions)
        values = jax.vmap(write)(values, value, positions)
        updated += [keys, values]
        groups = getattr(attention, "num_key_value_groups", None) or attention._num_key_value_groups
        mask = (jnp.arange(keys.shape[1])[None, :] <= positions[:, None])[:, None, :]  # [slots, 1, positions]
        attended = attention._compute_attention(
            query,
            ops.repeat(keys, repeats=groups, axis=2),
            ops.repeat(values, repeats=groups, axis=2),
            ops.cast(mask, "int32"),
        )
        x = attention._output_dense(attended) + residual

        residual = x
        normalized = block._feedforward_layernorm(x)
        # As the decoder block: the activation in float32 (what torch's silu does).
        gate = ops.cast(
            block.activation(ops.cast(block._feedforward_gate_dense(normalized), "float32")), block.compute_dtype
        )
        x = (
            block._feedforward_output_dense(ops.multiply(block._feedforward_intermediate_dense(normalized), gate))
            + residual
        )
    x = backbone.layer_norm(x)
    logits = backbone.token_embedding(x, reverse=True)
    return logits[:, 0], tuple(updated)


class _Programs:
    """The jitted init, prefill(+insert) and generate functions for one model and configuration.

    Shared by every Engine with the same (slots, steps per dispatch, context), so a second
    engine of the same model compiles nothing new.
    """

    def __init__(self, lm: keras_hub.models.CausalLM, slots: int, steps: int, context: int) -> None:
        import jax
        import jax.numpy as jnp
        import keras_hub

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

        # keras-hub caches are [1, layers, 2, length, kv_heads, head_dim]; find the length axis
        # rather than assume it, by building (abstractly) caches of two lengths.
        one, two = cache_spec(2), cache_spec(3)  # Not 1: keras warns about a softmax over 1 key.
        length_axes = [i for i, (a, b) in enumerate(zip(one.shape, two.shape, strict=True)) if a != b]
        if len(length_axes) != 1:
            raise TypeError(f"Cannot find the sequence axis of {type(lm).__name__}'s cache {one.shape}.")
        seq_axis = length_axes[0] + 1  # In the engine's cache, after the slot axis.
        # Gemma gets a decode step of the engine's own that updates the cache in place (see
        # _gemma_decode_step); other families go through keras-hub's call_with_cache.
        keras_hub_layout = one.shape == (1, lm.backbone.num_layers, 2, 2, *one.shape[4:])
        decoder = _in_place_decoder(lm, context) if keras_hub_layout else None
        in_place = decoder is not None
        decode_step, heads_first = decoder or (None, False)
        position_axis = 2 if heads_first else 1  # Of a per-layer cache [slots, ...].
        cache_shape = jax.ShapeDtypeStruct(
            tuple(context if i == length_axes[0] else n for i, n in enumerate(one.shape)), one.dtype
        )  # [1, layers, 2, context, kv_heads, head_dim] for keras-hub's decoders.

        def init(state: Any) -> tuple[Any, dict[str, Any]]:
            # Takes the variables only so that the arrays land on the devices they live on.
            self.traces["init"] += 1
            if in_place:  # Per layer, keys and values (see _layer_caches).
                _, layers, _, _, kv_heads, head_dim = cache_shape.shape
                part = (slots, kv_heads, context, head_dim) if heads_first else (slots, context, kv_heads, head_dim)
                cache: Any = tuple(jnp.zeros(part, cache_shape.dtype) for _ in range(2 * layers))
            else:
                cache = jnp.zeros((slots, *cache_shape.shape), cache_shape.dtype)
            slot_state = {
                "tokens": jnp.zeros((slots,), jnp.int32),
                "positions": jnp.zeros((slots,), jnp.int32),
                "keys": jnp.zeros((slots, 2), jnp.uint32),
                "temperature": jnp.zeros((slots,), jnp.float32),
                "top_k": jnp.zeros((slots,), jnp.int32),
                "top_p": jnp.ones((slots,), jnp.float32),
            }
            return cache, slot_state

        def prefill(
            state: Any,
            cache: Any,
            slot_state: dict[str, Any],
            token_ids: Any,
            length: Any,
            slot: Any,
            temperature: Any,
            top_k: Any,
            top_p: Any,
            key: Any,
        ) -> tuple[Any, dict[str, Any], Any]:
            self.traces[f"prefill[{token_ids.shape[1]}]"] += 1
            model, scope = stateless(state)
            with scope:
                _, prompt_cache = model._build_cache(token_ids)
                # The first new token, as generate_step computes it: the last prompt token run
                # again at its own index through call_with_cache (batch 1, so exactly
                # generate()'s arithmetic), then sampled with the request's parameters.
                last = jax.lax.dynamic_slice(token_ids, (0, length - 1), (1, 1))
                logits, _, prompt_cache = model.call_with_cache(last, prompt_cache, length - 1)
            first, next_key = _sample(
                logits[:, 0], temperature[None], top_k[None], top_p[None], key[None], greedy_sampler
            )
            # Insert: the prompt's cache at the start of the slot's. Whatever an earlier request
            # left beyond the prompt is masked by the causal mask until overwritten.
            if in_place:
                prompt_parts = _layer_caches(prompt_cache[None], heads_first)
                cache = tuple(
                    jax.lax.dynamic_update_slice(part, update.astype(part.dtype), (slot, 0, 0, 0))
                    for part, update in zip(cache, prompt_parts, strict=True)
                )
            else:
                start = (slot,) + (0,) * prompt_cache.ndim
                cache = jax.lax.dynamic_update_slice(cache, prompt_cache[None].astype(cache.dtype), start)
            # The slot resumes with the first new token, at the index after the prompt.
            updates = {
                "tokens": first[0],
                "positions": length,
                "keys": next_key[0],
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
            }
            slot_state = {name: value.at[slot].set(updates[name]) for name, value in slot_state.items()}
            return cache, slot_state, first

        def generate(
            state: Any, cache: Any, slot_state: dict[str, Any], active: Any, count: Any, window: int
        ) -> tuple[Any, dict[str, Any], Any]:
            self.traces[f"generate[{window}]"] += 1
            model, scope = stateless(state)
            limit = min(window, context)

            def one_slot(token: Any, slot_cache: Any, position: Any) -> tuple[Any, Any]:
                # Batch 1 inside, one cache index per slot outside (vmap).
                logits, _, slot_cache = model.call_with_cache(token[None, None], slot_cache, position)
                return logits[0, 0], slot_cache

            all_slots = jax.vmap(one_slot)

            def body(step: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
                cache, tokens, positions, keys, out = carry
                # Free slots keep running: clamp their index into the window (active slots are
                # below it); their writes are never read.
                clamped = jnp.minimum(positions, limit - 1)
                if in_place:
                    logits, cache = decode_step(model, tokens, cache, clamped)
                else:
                    logits, cache = all_slots(tokens, cache, clamped)
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

            # Attend over the first `window` positions only: every active slot's positions in
            # this dispatch are below it (the host picks it), and each step copies/transposes
            # the cache it sees, so the cost of a step grows with slots x window, not context.
            # The step gets a copy of the first `window` positions and it is written back after.
            if in_place:
                view = tuple(jax.lax.slice_in_dim(part, 0, limit, axis=position_axis) for part in cache)
            else:
                view = jax.lax.slice_in_dim(cache, 0, limit, axis=seq_axis)
            out = jnp.zeros((slots, steps), jnp.int32)
            carry = (view, slot_state["tokens"], slot_state["positions"], slot_state["keys"], out)
            with scope:
                # `count` (1..steps) is traced: a short dispatch needs no compilation of its own.
                view, tokens, positions, keys, out = jax.lax.fori_loop(0, count, body, carry)
            if in_place:
                # Only the positions this dispatch wrote go back: per slot, `steps` positions
                # from where it started (dynamic_slice clamps the start so that they fit in
                # the window; the host picked a window that holds start + count).
                chunk = min(steps, limit)
                starts = slot_state["positions"]

                axis = position_axis - 1  # Of one slot's cache.

                def written(window: Any, start: Any) -> Any:
                    return jax.lax.dynamic_slice_in_dim(window, start, chunk, axis=axis)

                def put(part: Any, update: Any, start: Any) -> Any:
                    return jax.lax.dynamic_update_slice_in_dim(
                        part, update, jnp.minimum(start, limit - chunk), axis=axis
                    )

                cache = tuple(
                    jax.vmap(put)(part, jax.vmap(written)(window, starts), starts)
                    for part, window in zip(cache, view, strict=True)
                )
            else:
                cache = jax.lax.dynamic_update_slice_in_dim(cache, view, 0, axis=seq_axis)
            slot_state = {**slot_state, "tokens": tokens, "positions": positions, "keys": keys}
            return cache, slot_state, out

        self.init = jax.jit(init)
        self.prefill = jax.jit(prefill, donate_argnums=(1, 2))
        # One compilation per decode window.
        self.generate = jax.jit(generate, donate_argnums=(1, 2), static_argnums=(5,))


_programs: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, int], _Programs]] = weakref.WeakKeyDictionary()
_programs_lock = threading.Lock()


def _programs_for(lm: keras_hub.models.CausalLM, slots: int, steps: int, context: int) -> _Programs:
    with _programs_lock:
        per_model = _programs.setdefault(lm, {})
        key = (slots, steps, context)
        if key not in per_model:
            per_model[key] = _Programs(lm, slots, steps, context)
        return per_model[key]


def default_buckets(context: int) -> tuple[int, ...]:
    """Prefill lengths: 64, 96, 128, 192, 256, 384, ... (two per octave), capped by the context.

    Prefill cost grows faster than linearly with the padded length (attention), and a prefill
    shape compiles in well under a second, so two buckets per octave (at most a third of a
    prefill wasted on padding) are worth their compilations. The context itself is always one.
    """
    buckets = []
    bucket = MIN_BUCKET
    while bucket < context:
        buckets.append(bucket)
        if bucket * 3 // 2 < context:
            buckets.append(bucket * 3 // 2)
        bucket *= 2
    return (*buckets, context)


def default_windows(context: int) -> tuple[int, ...]:
    """Decode windows: powers of two from 64, and the context (see ``Engine``)."""
    windows = []
    window = MIN_BUCKET
    while window < context:
        windows.append(window)
        window *= 2
    return (*windows, context)


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
    jitted call. Each bucket and each window is one compilation, all done by ``warm_up()``.

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
        steps_per_dispatch: int = DEFAULT_STEPS_PER_DISPATCH,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}.")
        if steps_per_dispatch < 1:
            raise ValueError(f"steps_per_dispatch must be at least 1, got {steps_per_dispatch}.")
        self.lm = lm
        self.slots = slots
        self.steps_per_dispatch = steps_per_dispatch
        self.context_length = context_length(lm)
        context = self.context_length
        self.buckets = _sizes("buckets", buckets, default_buckets(context), context)
        self.windows = _sizes("windows", windows, default_windows(context), context)
        self._tokenizer = lm.preprocessor.tokenizer
        pad = getattr(self._tokenizer, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else 0
        self._programs = _programs_for(lm, slots, steps_per_dispatch, self.context_length)
        _install_compile_listener()
        self._compilations = 0
        # Most requests decoded together so far: shows that concurrent callers shared a batch.
        self.peak_active_slots = 0

        self._cond = threading.Condition()
        self._pending: collections.deque[Request] = collections.deque()
        self._jobs: collections.deque[_WarmUp] = collections.deque()
        self._slots: list[Request | None] = [None] * slots
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._device: tuple[Any, Any, Any] | None = None  # (variables, cache, slot state)
        # Small per-dispatch arguments already on the device, re-sent only when they change:
        # a NumPy argument costs a host-to-device transfer on every call (~70 us a dispatch).
        self._inputs: dict[Any, Any] = {}

    # --- Public API -------------------------------------------------------------------------

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
        job = _WarmUp(self.buckets, self.windows)
        with self._cond:
            self._check_open()
            self._jobs.append(job)
            self._cond.notify_all()
        self.start()
        if not job.done.wait(timeout):
            raise TimeoutError(f"Warm-up did not finish within {timeout} s.")
        if job.error is not None:
            raise EngineError(f"Warm-up failed: {job.error!r}") from job.error

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
            bucket=next(b for b in self.buckets if b >= len(prompt_ids)),
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
        cache, slot_state = self._programs.init(state)
        self._device = (state, cache, slot_state)

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
                    jobs: list[_WarmUp] = []
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
                    in_flight = self._iterate(admitted, free, jobs, in_flight)
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
        jobs: list[_WarmUp],
        in_flight: _Dispatch | None,
    ) -> _Dispatch | None:
        """One loop iteration; returns the dispatch whose tokens are not processed yet."""
        programs = self._programs
        assert self._device is not None
        state, cache, slot_state = self._device
        for job in jobs:  # On an idle engine: compile every shape, with dummy inputs.
            inactive = self._input((False,) * self.slots, np.bool_)
            for bucket in job.buckets:
                token_ids = np.full((1, bucket), self._pad_id, dtype=np.int32)
                cache, slot_state, first = programs.prefill(
                    state, cache, slot_state, token_ids, np.int32(1), np.int32(0), *_slot_params(GREEDY)
                )
                self._device = (state, cache, slot_state)
                np.asarray(first)
            for window in job.windows:
                cache, slot_state, out = programs.generate(
                    state, cache, slot_state, inactive, self._input(self.steps_per_dispatch, np.int32), window
                )
                self._device = (state, cache, slot_state)
                np.asarray(out)
            job.done.set()

        first_tokens: list[tuple[Request, Any]] = []
        for request, slot in zip(admitted, free, strict=False):
            self._slots[slot] = request
            self.peak_active_slots = max(self.peak_active_slots, self.active_slots)
            request._slot = slot
            request._position = len(request.prompt_ids)  # Index of the next step.
            token_ids = np.full((1, request._bucket), self._pad_id, dtype=np.int32)
            token_ids[0, : len(request.prompt_ids)] = request.prompt_ids
            cache, slot_state, first = programs.prefill(
                state,
                cache,
                slot_state,
                token_ids,
                np.int32(len(request.prompt_ids)),
                np.int32(slot),
                *_slot_params(request.sampling),
            )
            self._device = (state, cache, slot_state)
            first_tokens.append((request, first))

        dispatched = None
        owners = tuple(self._slots)
        running = [r for r in owners if r is not None]
        if running:
            count = self.steps_per_dispatch
            # The smallest window that holds every position this dispatch writes.
            needed = max(r._position for r in running) + count
            window = next((w for w in self.windows if w >= needed), self.context_length)
            for request in running:
                request._position += count
            active = self._input(tuple(r is not None for r in owners), np.bool_)
            cache, slot_state, out = programs.generate(
                state, cache, slot_state, active, self._input(count, np.int32), window
            )
            self._device = (state, cache, slot_state)
            dispatched = (out, owners, count)

        # Host work below overlaps the dispatched step (JAX dispatches asynchronously).
        if in_flight is not None:
            self._process(*in_flight)
        # Prefill sampled each new request's first token: it reaches the reader now, before the
        # dispatch above (which already continues from it) is done.
        for request, first in first_tokens:
            if request._cancel_requested:
                self._release(request)
                request._end("cancelled")
            else:
                self._accept(request, [int(np.asarray(first)[0])])
        return dispatched

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

    def _process(self, out: Any, owners: tuple[Request | None, ...], count: int) -> None:
        rows = np.asarray(out)[:, :count].tolist()  # The one device-to-host read of a dispatch.
        for row, request in zip(rows, owners, strict=True):
            if request is None or request._finished.is_set():
                continue  # A free slot, or a request that ended after this dispatch started.
            if request._cancel_requested:
                self._release(request)
                request._end("cancelled")
                continue
            self._accept(request, row)

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
