"""Benchmark: serial keras-hub ``generate()`` against the continuous-batching Engine.

Same model, same prompts (single- and multi-turn calendar-assistant requests rendered with the
model family's chat template and the arena's system prompt), greedy decoding in both paths.

What is measured, and why it is a like-for-like comparison:

* Both paths generate exactly the same number of tokens for each prompt. ``generate()`` runs
  with ``stop_token_ids=None`` and one fixed ``max_length`` (the longest prompt plus
  ``max_new_tokens``, capped by the context), so it always generates ``max_length - prompt``
  tokens and compiles once; the engine gets the same per-prompt count as ``max_new_tokens``
  with ``ignore_stop_tokens=True``. Token counts are therefore exact, not estimated from text.
* Serial ``generate()``: batch 1, one prompt after another, after one untimed warm-up call
  (its compilation). It returns only at the end, so its "time to first token" is its whole
  latency; per-stream tokens/s is tokens / latency.
* Engine: after ``warm_up()``, for each concurrency level N, N client threads each keep one
  request in flight (submit, iterate the deltas, submit the next) until all prompts are done.
  TTFT is measured from ``submit()`` (queueing for a slot included) to the first generated
  token reaching the host; per-stream tokens/s is the decode rate a reader sees once text flows,
  (tokens - 1) / (duration - TTFT); aggregate tokens/s is all tokens / the level's wall time.
* ``speedup_8`` = engine aggregate tokens/s at concurrency 8 / serial generate() tokens/s;
  ``ttft_ratio_8`` = TTFT p50 at concurrency 8 / TTFT p50 at concurrency 1 (an idle engine);
  ``recompiles_after_warmup`` = XLA compilations by the engine after ``warm_up()``;
  ``outputs_consistent`` = every level produced, prompt by prompt, the same text as level 1
  (greedy decoding must not depend on what else is in the batch).
* Rounds: serial ``generate()`` and every engine level run in turn, ``repeats`` times, and each
  path's figures pool its rounds (all requests, all wall time), so that a passing slowdown of
  a shared machine weighs on every path alike rather than on whichever ran during it.
* The engine's prefix cache is on (as in serving): the prompts share the chat template and the
  system prompt, which the engine prefills once and ``generate()`` prefills for every prompt.
  The result says how many prompt tokens came from the cache; ``--no-prefix-cache`` measures
  the engine without it.

Timings depend on the machine and on whatever else runs on it; the result records the CPU count.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import dataclasses
import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.chat_templates import ChatTurn, render_prompt
from inference.forward.layout import best_seconds, products_seconds
from inference.registry import local_presets, read_preset

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_CONCURRENCY = (1, 4, 8, 16)

_NAMES = ("Fred", "Paul", "Anna", "Maria", "John", "Li", "Sofia", "Omar", "Emma", "Noah", "Yuki", "Ravi")
_MONTHS = ("Jan", "Feb", "March", "April", "May", "June", "July", "Aug", "Sept", "Oct", "Nov", "Dec")
_EVENTS = ("rock concert", "dentist appointment", "yoga class", "team lunch", "piano lesson", "book club")


_models: dict[str, Any] = {}
_models_lock = threading.Lock()


def _load(path: Path) -> Any:
    """The bench's own instance of a preset, loaded once per process.

    Not ``streaming.load_causal_lm``'s shared instance: the bench switches ``generate()`` to the
    greedy sampler, which must not leak into a process that also serves. Reusing one instance
    across runs also reuses the engine's compiled functions.
    """
    from inference.keras_build import causal_lm_from_preset

    key = str(path.resolve())
    with _models_lock:
        if key not in _models:
            lm = causal_lm_from_preset(str(path))
            lm.compile(sampler="greedy")
            _models[key] = lm
        return _models[key]


def resident_mib(field: str = "VmRSS") -> float:
    """This process's resident memory (Linux's ``VmRSS``; ``VmHWM``: its peak so far), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"No {field} in /proc/self/status: resident memory is measured on Linux only.")


STEP_WINDOWS_UP_TO = 1024  # ``resident_memory`` times decode steps at the windows up to this.


def resident_memory(
    preset: str | Path,
    *,
    slots: int,
    prefix_cache_rows: int,
    prefix_cache_tokens: int,
    compact: bool = False,
    cache_dtype: str | None = None,
    embedding_dtype: str | None = None,
    beside: str | Path | None = None,
    adapters: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """What one model holds resident in the arena's engine, measured in this process: loaded
    as the arena loads it (``inference.hosts.engines``), then warmed up (every shape compiled,
    freed memory handed back). Call it in a process that has loaded no model: the first one
    also pays for JAX's own start, reported apart (``runtime_mib``). ``beside``: another
    preset loaded and warmed first, as the arena serves them together (a fixer beside its base:
    what it adds, sharing the base's equal weights and compiled programs). ``adapters``: presets
    fine-tuned from this one, served by its engine as LoRA adapters as the roster serves a fixer
    (``inference.services.model_spec``: the slots for each model served; what is reported is the
    engine with them all). Then it times a decode step of every slot at each window up to
    ``STEP_WINDOWS_UP_TO`` positions (``step_ms``)."""
    import jax.numpy as jnp

    from inference.hosts import engines
    from inference.registry import read_preset

    def spec_of(preset: str | Path) -> engines.ModelSpec:
        path = Path(preset)
        return engines.ModelSpec(
            name=path.name,
            family=read_preset(path).family,
            preset=str(path.resolve()),
            slots=slots,
            prefix_cache_rows=prefix_cache_rows,
            prefix_cache_tokens=prefix_cache_tokens,
            compact=compact,
            cache_dtype=cache_dtype,
            embedding_dtype=embedding_dtype,
        )

    path = Path(preset)
    spec = spec_of(path)
    if adapters:
        tuned = tuple(str(Path(adapter).resolve()) for adapter in adapters)
        spec = dataclasses.replace(spec, adapters=tuned, slots=slots * (1 + len(tuned)))
    before = resident_mib()
    jnp.zeros(1).block_until_ready()  # JAX's CPU client, before the model.
    if beside is not None:
        engines.warm_up(spec_of(beside))
    runtime = resident_mib()
    engine = engines.engine_for(spec)
    loaded = resident_mib()
    began = time.perf_counter()
    engines.warm_up(spec)
    warm = resident_mib()
    result = {
        "preset": path.name,
        "parameters": engine.lm.count_params(),
        "slots": spec.slots,
        "adapters": [Path(adapter).name for adapter in adapters],
        "prefix_cache_rows": engine.prefix_cache.entries,
        "prefix_cache_tokens": engine.prefix_cache.capacity,
        "compact": compact,
        "cache_dtype": engine.cache_dtype,
        "embedding_dtype": str(engine.lm.backbone.token_embedding.embeddings.dtype),
        "layout": engine.forward_layout,  # The Llama pass's, timed at load (its laid-out copy).
        "beside": None if beside is None else Path(beside).name,
        "compilations": engine.compilations,
        "warm_up_s": time.perf_counter() - began,
        "process_mib": before,
        "runtime_mib": runtime - before,
        "loaded_mib": loaded - runtime,
        "warm_up_mib": warm - loaded,
        "model_mib": warm - runtime,
        "peak_mib": resident_mib("VmHWM"),  # The process's, from its start.
    }
    # Then, what a decode step of every slot costs at each window up to STEP_WINDOWS_UP_TO
    # positions (``Engine.decode_step_seconds``, as the throughput run reports it): what the
    # settings that save memory (compact shapes, the cache dtype) cost in speed.
    timed = [window for window in engine.windows if window <= STEP_WINDOWS_UP_TO] or list(engine.windows[:1])
    result["step_ms"] = {str(window): 1000 * engine.decode_step_seconds(window, seconds=1.0) for window in timed}
    engines.shutdown_all()
    return result


def format_memory(result: dict[str, Any]) -> str:
    before = f"JAX's start and {result['beside']}" if result["beside"] else "JAX's own start"
    return (
        f"{result['preset']} ({result['parameters']:,} parameters; {result['slots']} slots, prefix pool "
        f"{result['prefix_cache_rows']} x {result['prefix_cache_tokens']}"
        f"{', compact shapes' if result['compact'] else ''}, {result['cache_dtype']} caches, "
        f"{result['embedding_dtype']} embedding"
        f"{', ' + result['layout'] if result['layout'] else ''}"
        f"{', beside ' + result['beside'] if result['beside'] else ''}"
        f"{', serving ' + ' and '.join(result['adapters']) + ' as LoRA adapters' if result['adapters'] else ''}): "
        f"{result['model_mib']:.0f} MiB resident "
        f"once warm ({result['loaded_mib']:.0f} MiB loaded, +{result['warm_up_mib']:.0f} MiB for "
        f"{result['compilations']} compiled programs and caches); "
        f"{before} {result['runtime_mib']:.0f} MiB before it; warm-up {result['warm_up_s']:.0f} s; "
        f"the process's peak {result['peak_mib']:.0f} MiB; a decode step of every slot "
        + ", ".join(f"{ms:.1f} ms over {window} positions" for window, ms in result["step_ms"].items())
    )


def default_preset(presets_dir: Path = PRESETS_DIR) -> Path:
    """The strong bundled preset (its metadata.json says ``"quality": "strong"``)."""
    strong = [preset.path for preset in local_presets(presets_dir) if preset.quality == "strong"]
    if not strong:
        raise ValueError(
            f"No strong demo preset in {presets_dir}; pass --preset, or run `python manage.py build_demo_models`."
        )
    return strong[0]


def calendar_conversations(count: int, seed: int = 0) -> list[list[ChatTurn]]:
    """Deterministic calendar-assistant conversations ending with a user turn (see scenario.md).

    Four shapes in turn (a new meeting; its year correction; an evening event; a cancellation),
    so prompt lengths vary and several prefill buckets are used.
    """
    rng = random.Random(seed)
    conversations = []
    for index in range(count):
        name = rng.choice(_NAMES)
        month = rng.randrange(12)
        day = rng.randrange(1, 29)
        hour = rng.randrange(7, 12)
        add = f"Add a meeting with {name} on {_MONTHS[month]} {day} at {hour}AM"
        call = (
            f'action.add_calendar_entry("Meeting with {name}", date="2023-{month + 1:02d}-{day:02d}", '
            f'time="{hour:02d}:00", duration=30)'
        )
        shape = index % 4
        if shape == 0:
            turns = [ChatTurn("user", add)]
        elif shape == 1:
            turns = [ChatTurn("user", add), ChatTurn("assistant", call), ChatTurn("user", "The current year is 2024.")]
        elif shape == 2:
            event = rng.choice(_EVENTS)
            evening = rng.randrange(6, 10)
            turns = [
                ChatTurn(
                    "user",
                    f"I'm going to a {event} in the evening of {_MONTHS[month]} {day} at {evening}pm. "
                    "Add a calendar entry for that.",
                )
            ]
        else:
            cancel = ChatTurn("user", f"Cancel the meeting with {name}.")
            turns = [ChatTurn("user", add), ChatTurn("assistant", call), cancel]
        conversations.append(turns)
    return conversations


def bench_prompts(family: str, count: int, seed: int = 0) -> list[str]:
    from inference.building.calendar_data import SYSTEM_PROMPT

    return [render_prompt(family, SYSTEM_PROMPT, turns) for turns in calendar_conversations(count, seed)]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def _summary(
    tokens: Sequence[int], ttfts: Sequence[float], stream_rates: Sequence[float], wall_s: float
) -> dict[str, Any]:
    total = int(sum(tokens))
    return {
        "requests": len(tokens),
        "tokens": total,
        "wall_s": wall_s,
        "aggregate_tokens_per_s": total / wall_s if wall_s > 0 else 0.0,
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p95_s": _percentile(ttfts, 95),
        "stream_tokens_per_s_p50": _percentile(stream_rates, 50),
    }


class _Samples:
    """One path's measurements, pooled over the repeats: per request and total wall time."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ttfts: list[float] = []
        self.rates: list[float] = []
        self.wall_s = 0.0
        self.compilations = 0  # The engine's, while this path ran.

    def summary(self) -> dict[str, Any]:
        return _summary(self.tokens, self.ttfts, self.rates, self.wall_s)


def _serial_generate(lm: Any, max_length: int) -> Callable[[str], None]:
    """``generate()`` of one prompt at ``max_length``, compiled (untimed) by a first call."""
    from inference.streaming import encode_prompt

    # generate() would add a second start token to a prompt that already has one (Llama 3's
    # template): strip its text, as the engine's encode_prompt does, so both see the same ids.
    start = getattr(lm.preprocessor.tokenizer, "start_token", None)
    if not lm.preprocessor.add_start_token:
        # keras-hub's generate() adds the start token even where the preprocessor is told not
        # to (SmolLM2): run what generate() runs after tokenizing, its compiled generate
        # function, on the prompt's own ids, so that both paths decode the same sequence.
        generate_function = lm.make_generate_function()
        pad = int(getattr(lm.preprocessor.tokenizer, "pad_token_id", 0) or 0)

        def generate_ids(prompt: str) -> None:
            ids = encode_prompt(lm, prompt)
            padding = max_length - len(ids)
            inputs = {
                "token_ids": np.asarray([ids + [pad] * padding], np.int32),
                "padding_mask": np.asarray([[True] * len(ids) + [False] * padding]),
            }
            np.asarray(generate_function(inputs, stop_token_ids=None)["token_ids"])

        return generate_ids

    def generate(prompt: str) -> None:
        if start and getattr(lm.preprocessor, "add_start_token", False):
            prompt = prompt.removeprefix(start)
        lm.generate(prompt, max_length=max_length, stop_token_ids=None)

    return generate


def machine_rates(seconds: float = 1.0) -> dict[str, float]:
    """This machine's memory read bandwidth (bytes/s) and float32 matmul rate (FLOP/s), each the
    best of repeated runs for about ``seconds``.

    Memory: summing a 512 MB float32 array (larger than any cache), both ways, and the faster
    counts: JAX's reduction, on the engine's backend and threads (every core), and NumPy's, on
    one thread (``memory_bytes_per_s_one_thread``, the only figure before 2026-12-04: on a
    2-core machine it read about a quarter less than both cores do, which made the bound look
    closer than it is). Matmul: JAX, 1024 x 1024, the engine's backend and threads.
    """
    import jax
    import jax.numpy as jnp

    array = np.ones(128 * 1024 * 1024, dtype=np.float32)
    one_thread = array.nbytes / best_seconds(lambda: array.sum(), seconds)
    on_device = jnp.asarray(array)
    total = jax.jit(jnp.sum)
    all_cores = array.nbytes / best_seconds(lambda: total(on_device).block_until_ready(), seconds)
    size = 1024
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    flops = 2 * size**3 / best_seconds(lambda: matmul(a).block_until_ready(), seconds)
    return {
        "memory_bytes_per_s": max(one_thread, all_cores),
        "memory_bytes_per_s_one_thread": one_thread,
        "memory_bytes_per_s_all_cores": all_cores,
        "flops_per_s": flops,
    }


def matmul_floor(lm: Any, batch: int, seconds: float = 1.0) -> float:
    """Tokens/s if a decode step of ``batch`` tokens cost only its weight matmuls: one jitted
    function multiplies ``batch`` rows by every kernel of the model and by the output
    projection (each read from memory once, as in a step), best of repeated runs, in whichever
    orientation is faster here.

    The memory and compute bounds assume the matmuls run at the bandwidth or at the 1024 x
    1024 rate; at a few rows they run at neither (the matrix is read once but the multiply
    does not reach the large-matmul rate), and this measures what they do reach: no forward
    pass can beat it. Both orientations a pass can take are timed: ``rows [B, in] @ kernel
    [in, out]`` (keras-hub's, and the Gemma passes') and ``kernel [out, in] @ columns [in, B]``
    (the Llama pass's, ``inference.forward.llama``), each with its kernels laid out for it
    beforehand; the bytes and FLOPs are the model's.
    """

    hidden = int(lm.backbone.hidden_dim)
    kernels = []
    for variable in lm.backbone.weights:
        array = np.asarray(variable)
        if array.ndim < 2:
            continue
        if variable.path.rsplit("/", 1)[-1] == "embeddings":  # The input embedding:
            if not getattr(lm.backbone.token_embedding, "tie_weights", True):
                continue  # a lookup, not a matmul, where the output projection is its own
            array = array.T  # else also the output projection, laid out [hidden, vocabulary]
        elif array.ndim > 2 and array.shape[0] == hidden:  # [hidden, heads, head_dim]
            array = array.reshape(hidden, -1)
        elif array.ndim > 2:  # [heads, head_dim, hidden] (or Gemma's [heads, hidden, head_dim])
            array = array.reshape(-1, array.shape[-1])
        kernels.append(array)
    # Rows first, then columns (each set of kernels is freed before the next is laid out).
    best = min(
        products_seconds(kernels, batch, columns=False, seconds=seconds),
        products_seconds(kernels, batch, columns=True, seconds=seconds),
    )
    return batch / best


def roofline(lm: Any, rates: dict[str, float], batch: int) -> dict[str, float]:
    """The most tokens/s a decode step of ``batch`` tokens can give here: every step reads all
    the weights once (bytes), and each token costs about 2 FLOPs per parameter (its matmuls;
    attention over a short context adds little). Whichever limit is lower is the bound."""
    parameters = int(lm.count_params())
    weight_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in lm.weights)
    flops_per_token = 2.0 * parameters
    memory_bound = batch * rates["memory_bytes_per_s"] / weight_bytes
    compute_bound = rates["flops_per_s"] / flops_per_token
    return {
        "batch": batch,
        "weight_bytes_per_step": weight_bytes,
        "flops_per_token": flops_per_token,
        "memory_bound_tokens_per_s": memory_bound,
        "compute_bound_tokens_per_s": compute_bound,
        "bound_tokens_per_s": min(memory_bound, compute_bound),
    }


def _bench_serial_generate(
    generate: Callable[[str], None],
    prompts: Sequence[str],
    prompt_lengths: Sequence[int],
    max_length: int,
    samples: _Samples,
) -> None:
    began = time.perf_counter()
    for prompt, length in zip(prompts, prompt_lengths, strict=True):
        started = time.perf_counter()
        generate(prompt)
        latency = time.perf_counter() - started
        tokens = max_length - length  # No stop tokens: it always runs to max_length.
        samples.tokens.append(tokens)
        samples.ttfts.append(latency)
        samples.rates.append(tokens / latency)
    samples.wall_s += time.perf_counter() - began


def _bench_engine_level(
    engine: Any, prompts: Sequence[str], new_tokens: Sequence[int], concurrency: int, samples: _Samples
) -> list[str]:
    texts: list[str] = [""] * len(prompts)
    ttfts: list[float] = []
    rates: list[float] = []
    tokens: list[int] = []
    errors: list[BaseException] = []
    next_index = itertools.count()
    lock = threading.Lock()

    def client() -> None:
        try:
            while (index := next(next_index)) < len(prompts):
                request = engine.submit(prompts[index], max_new_tokens=new_tokens[index], ignore_stop_tokens=True)
                texts[index] = "".join(request)
                stats = request.stats
                with lock:
                    tokens.append(stats.tokens)
                    ttfts.append(stats.ttft_s or 0.0)
                    decode_s = stats.duration_s - (stats.ttft_s or 0.0)
                    if stats.tokens > 1 and decode_s > 0:
                        rates.append((stats.tokens - 1) / decode_s)
        except BaseException as exc:
            errors.append(exc)

    compilations = engine.compilations
    threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    samples.wall_s += time.perf_counter() - began
    samples.compilations += engine.compilations - compilations
    if errors:
        raise errors[0]
    samples.tokens += tokens
    samples.ttfts += ttfts
    samples.rates += rates
    return texts


def run_bench(
    preset: str | Path | None = None,
    *,
    prompts: int = 32,
    max_new_tokens: int = 64,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    slots: int = 8,
    steps_per_dispatch: int | None = None,
    repeats: int = 3,
    prefix_cache: bool = True,
    buckets: Sequence[int] | None = None,
    windows: Sequence[int] | None = None,
    progress: Callable[[str], None] | None = None,
    timing_seconds: float = 1.0,
) -> dict[str, Any]:
    """Run both paths on one preset and return the figures as a JSON-serialisable dict.

    The whole set of prompts goes through serial ``generate()`` and then through the engine at
    each concurrency level, ``repeats`` times in turn, and each path's figures pool its
    repeats: a passing slowdown of a shared machine then weighs on every path alike.
    ``buckets`` and ``windows`` go to the ``Engine`` (default: the engine's, as the arena
    serves); fewer of them make a smoke run's warm-up shorter. ``timing_seconds``: how long each
    timing of the machine (memory read, matmul rate, each matmul-floor orientation) runs, and a
    third of how long each busy decode step is timed; a smoke run takes less.
    """
    from inference.engine import DEFAULT_PREFIX_CACHE_ROWS, Engine
    from inference.streaming import context_length, encode_prompt

    if prompts < 1 or max_new_tokens < 1 or repeats < 1:
        raise ValueError("prompts, max_new_tokens and repeats must be at least 1.")
    if not timing_seconds > 0:
        raise ValueError(f"timing_seconds must be positive, got {timing_seconds}.")
    if not concurrency or any(c < 1 for c in concurrency):
        raise ValueError(f"Concurrency levels must be positive, got {list(concurrency)}.")
    say = progress or (lambda message: None)
    path = Path(preset) if preset is not None else default_preset()
    info = read_preset(path)
    lm = _load(path)
    texts = bench_prompts(info.family, prompts)
    lengths = [len(encode_prompt(lm, text)) for text in texts]
    max_length = min(max(lengths) + max_new_tokens, context_length(lm))
    if max_length <= max(lengths):
        raise ValueError(f"The longest prompt ({max(lengths)} tokens) leaves no room in the context.")
    new_tokens = [max_length - n for n in lengths]

    generate = _serial_generate(lm, max_length)
    generate(texts[0])  # Compiles generate() for this max_length; untimed.
    rows = DEFAULT_PREFIX_CACHE_ROWS if prefix_cache else 0
    engine = Engine(
        lm,
        slots=slots,
        steps_per_dispatch=steps_per_dispatch,
        prefix_cache_rows=rows,
        buckets=buckets,
        windows=windows,
    )
    serial = _Samples()
    engine_samples = {level: _Samples() for level in concurrency}
    consistent = True
    try:
        began = time.perf_counter()
        engine.warm_up()
        warmup_s = time.perf_counter() - began
        after_warmup = engine.compilations
        reference: list[str] | None = None
        for repeat in range(1, repeats + 1):
            say(f"round {repeat}/{repeats}: serial generate(), {prompts} prompts, max_length {max_length}")
            _bench_serial_generate(generate, texts, lengths, max_length, serial)
            for level in concurrency:
                say(f"round {repeat}/{repeats}: engine, concurrency {level}")
                outputs = _bench_engine_level(engine, texts, new_tokens, level, engine_samples[level])
                reference = reference or outputs
                consistent = consistent and outputs == reference
        recompiles = engine.compilations - after_warmup
        settled_steps = engine.steps_per_dispatch
        # The engine's ceiling on this workload: a decode step of every slot, no prefill, no
        # idle slot, at each window the prompts' positions pass through.
        used = [w for w in engine.windows if w >= min(lengths)]
        used = used[: next(i for i, w in enumerate(used) if w >= max_length) + 1]
        busy_steps = []
        for window in used:
            step_s = engine.decode_step_seconds(window, seconds=3 * timing_seconds)
            busy_steps.append({"window": window, "step_s": step_s, "tokens_per_s": slots / step_s})
        prefix_stats = {
            "rows": engine.prefix_cache.entries,
            "hits": engine.prefix_cache.hits,
            "reused_tokens": engine.prefix_cache.reused_tokens,
            "prompt_tokens": sum(lengths) * repeats * len(concurrency),
        }
    finally:
        engine.shutdown()

    levels = []
    for level, samples in engine_samples.items():
        levels.append({**samples.summary(), "concurrency": level, "compilations": samples.compilations})
    serial_summary = serial.summary()
    serial_summary["note"] = "generate() does not stream: TTFT is the whole latency"

    by_level = {level["concurrency"]: level for level in levels}
    rates = machine_rates(timing_seconds)
    bounds = []
    for level in (1, 8):
        if level in by_level:
            bound = roofline(lm, rates, min(level, slots))
            bound["engine_tokens_per_s"] = by_level[level]["aggregate_tokens_per_s"]
            bound["engine_share_of_bound"] = bound["engine_tokens_per_s"] / bound["bound_tokens_per_s"]
            bound["matmul_floor_tokens_per_s"] = matmul_floor(lm, bound["batch"], timing_seconds)
            bound["engine_share_of_matmul_floor"] = bound["engine_tokens_per_s"] / bound["matmul_floor_tokens_per_s"]
            if level >= slots:  # Every slot busy: the steps timed above.
                bound["busy_step_share_of_bound"] = {
                    str(step["window"]): step["tokens_per_s"] / bound["bound_tokens_per_s"] for step in busy_steps
                }
            bounds.append(bound)
    serial_rate = serial_summary["aggregate_tokens_per_s"]
    speedup_8 = by_level[8]["aggregate_tokens_per_s"] / serial_rate if 8 in by_level and serial_rate else None
    ttft_ratio_8 = (
        by_level[8]["ttft_p50_s"] / by_level[1]["ttft_p50_s"]
        if 8 in by_level and 1 in by_level and by_level[1]["ttft_p50_s"]
        else None
    )
    return {
        "preset": str(path),
        "family": info.family,
        "prompts": prompts,
        "prompt_tokens_min": min(lengths),
        "prompt_tokens_max": max(lengths),
        "max_length": max_length,
        "tokens_per_prompt_min": min(new_tokens),
        "tokens_per_prompt_max": max(new_tokens),
        "slots": slots,
        # None: the engine's default, as the arena serves (the fewest steps that last
        # DISPATCH_TARGET_S, measured as it runs); then the count it settled at.
        "steps_per_dispatch": steps_per_dispatch,
        "steps_per_dispatch_settled": settled_steps,
        "max_steps_per_dispatch": engine.max_steps_per_dispatch,
        # The Llama pass's layout, the faster one here (None for other families).
        "forward_layout": engine.forward_layout,
        "repeats": repeats,
        "cpu_count": os.cpu_count(),
        "serial_generate": serial_summary,
        "engine_warmup_s": warmup_s,
        "prefix_cache": prefix_stats,
        "engine": levels,
        "speedup_8": speedup_8,
        "ttft_ratio_8": ttft_ratio_8,
        "recompiles_after_warmup": recompiles,
        "busy_decode_steps": busy_steps,
        "outputs_consistent": consistent,
        "machine": rates,
        "roofline": bounds,
    }


def _prefix_line(stats: dict[str, Any]) -> str:
    if not stats["rows"]:
        return "prefix cache: off"
    share = stats["reused_tokens"] / stats["prompt_tokens"] if stats["prompt_tokens"] else 0.0
    return (
        f"prefix cache: {stats['hits']} hits, {stats['reused_tokens']} of {stats['prompt_tokens']} prompt "
        f"tokens ({share:.0%}) not prefilled again"
    )


def _steps_text(result: dict[str, Any]) -> str:
    if result["steps_per_dispatch"] is not None:
        return f"{result['steps_per_dispatch']} steps/dispatch"
    most, settled = result["max_steps_per_dispatch"], result["steps_per_dispatch_settled"]
    return f"steps/dispatch adaptive up to {most} (settled at {settled})"


def _layout_text(result: dict[str, Any]) -> str:
    layout = result.get("forward_layout")
    return f", {layout} projections (the faster here)" if layout else ""


def format_table(result: dict[str, Any]) -> str:
    """The figures as a plain-text table, with the headline ratios underneath."""
    header = (
        f"{'path':<22} {'TTFT p50':>10} {'TTFT p95':>10} {'stream tok/s':>13} {'aggregate tok/s':>16} {'compiles':>9}"
    )
    lines = [
        f"preset {result['preset']} ({result['family']}); {result['prompts']} prompts of "
        f"{result['prompt_tokens_min']}-{result['prompt_tokens_max']} tokens, "
        f"{result['tokens_per_prompt_min']}-{result['tokens_per_prompt_max']} new tokens each; "
        f"{result['slots']} slots, {_steps_text(result)}{_layout_text(result)}; {result['repeats']} rounds "
        f"pooled; {result['cpu_count']} CPUs",
        header,
        "-" * len(header),
    ]

    def row(name: str, figures: dict[str, Any], compiles: str) -> str:
        return (
            f"{name:<22} {figures['ttft_p50_s'] * 1e3:>8.1f}ms {figures['ttft_p95_s'] * 1e3:>8.1f}ms "
            f"{figures['stream_tokens_per_s_p50']:>13.0f} {figures['aggregate_tokens_per_s']:>16.0f} {compiles:>9}"
        )

    lines.append(row("serial generate()", result["serial_generate"], "-"))
    for level in result["engine"]:
        lines.append(row(f"engine x{level['concurrency']}", level, str(level["compilations"])))
    speedup = result["speedup_8"]
    ratio = result["ttft_ratio_8"]
    lines += [
        "",
        "serial generate() does not stream: its TTFT is its whole latency.",
        f"speedup_8 (engine x8 / serial generate()): {speedup:.2f}" if speedup else "speedup_8: n/a (no level 8)",
        f"ttft_ratio_8 (TTFT p50 x8 / x1): {ratio:.2f}" if ratio else "ttft_ratio_8: n/a",
        f"recompiles after warm-up: {result['recompiles_after_warmup']} (warm-up {result['engine_warmup_s']:.1f} s)",
        _prefix_line(result["prefix_cache"]),
        f"outputs identical across concurrency levels: {result['outputs_consistent']}",
    ]
    machine = result.get("machine")
    if machine:
        one_thread = machine.get("memory_bytes_per_s_one_thread")
        lines.append(
            f"this machine: memory read {machine['memory_bytes_per_s'] / 1e9:.1f} GB/s"
            + (f" (one thread: {one_thread / 1e9:.1f})" if one_thread else "")
            + f", float32 matmul {machine['flops_per_s'] / 1e9:.1f} GFLOP/s"
        )
    for bound in result.get("roofline", []):
        lines.append(
            f"bound at batch {bound['batch']}: {bound['weight_bytes_per_step'] / 1e6:.0f} MB of weights read per "
            f"step, {bound['flops_per_token'] / 1e6:.0f} MFLOP per token -> memory "
            f"{bound['memory_bound_tokens_per_s']:.0f} / compute {bound['compute_bound_tokens_per_s']:.0f} tokens/s; "
            f"engine {bound['engine_tokens_per_s']:.0f} tokens/s = {bound['engine_share_of_bound']:.0%} of the bound"
        )
        lines.append(
            f"  the step's weight matmuls alone at batch {bound['batch']}: "
            f"{bound['matmul_floor_tokens_per_s']:.0f} tokens/s; engine = "
            f"{bound['engine_share_of_matmul_floor']:.0%} of that"
        )
        for window, share in bound.get("busy_step_share_of_bound", {}).items():
            step = next(s for s in result["busy_decode_steps"] if str(s["window"]) == window)
            lines.append(
                f"  a decode step of every slot over {window} positions (no prefill, no idle slot): "
                f"{step['step_s'] * 1e3:.1f} ms, {step['tokens_per_s']:.0f} tokens/s = {share:.0%} of the bound"
            )
    return "\n".join(lines)
