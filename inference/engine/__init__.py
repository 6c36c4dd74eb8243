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
  (``inference.engine.prefix_cache``): the keys and values of recent prompts' beginnings stay in a
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
  engine's own instead (``inference.forward``, one module per family; its
  ``in_place_decoder`` says when one applies; Gemma 3 runs only this way, since its keras-hub
  cache also takes image inputs), used for decode steps (one token per slot) and prefill
  chunks (many tokens of one slot): the same
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

The package: ``scheduler`` (``Engine``: the slots, the queue and the decode thread), ``programs``
(the jitted functions), ``sampling`` (``SamplingParams`` and the in-jit draw), ``requests``
(``Request``, what a caller iterates), ``shapes`` (prefill buckets and decode windows),
``shared_weights`` (equal weights held once by the models of one architecture); the
families' forward passes are in ``inference.forward``.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from inference.engine.requests import EngineClosedError, EngineError, EngineStopReason, Request
from inference.engine.sampling import GREEDY, SamplingParams
from inference.engine.scheduler import (
    DEFAULT_PREFIX_CACHE_ROWS,
    DEFAULT_STEPS_PER_DISPATCH,
    DISPATCH_TARGET_S,
    Engine,
)
from inference.engine.shapes import default_buckets, default_windows

__all__ = [
    "DEFAULT_PREFIX_CACHE_ROWS",
    "DEFAULT_STEPS_PER_DISPATCH",
    "DISPATCH_TARGET_S",
    "GREEDY",
    "Engine",
    "EngineClosedError",
    "EngineError",
    "EngineStopReason",
    "Request",
    "SamplingParams",
    "default_buckets",
    "default_windows",
]
