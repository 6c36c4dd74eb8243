"""The engines of one inference host process: each model loaded once, one batching engine each.

Plain module (no Django). Every generation job in the process — Celery thread-pool tasks on an
inference host, or the in-process worker of the embedded mode — gets its model's engine from
here, so concurrent replies of the same model share one decode batch. A fine-tuned model whose
spec names the model it was tuned from (``ModelSpec.adapter_of``) is served by that model's
engine as a LoRA adapter (its change to the kernels, unmerged: ``inference.forward.adapters``),
so the two share weights, caches and decode steps.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

os.environ.setdefault("KERAS_BACKEND", "jax")

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.engine.adapter_engine import AdapterEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """How to load one roster model; changing any field means loading it anew."""

    name: str
    family: str
    preset: str
    dtype: str | None = None
    mesh_shape: tuple[int, int] | None = None
    slots: int = 8
    prefix_cache_rows: int = 16
    prefix_cache_tokens: int = 1024  # At most: the engine keeps at most half the context.
    compact: bool = False  # Compile powers of two only (Engine's ``compact``): half the programs' memory.
    cache_dtype: str | None = None  # Keys and values kept in this dtype (Engine's); None: the model's.
    # The token embedding kept in this dtype (inference.engine.stored_dtype) where the family's
    # pass runs it at least as fast (inference.forward.narrow_embedding_pays); None: the model's.
    embedding_dtype: str | None = None
    # Presets of models fine-tuned from this one that its engine serves as LoRA adapters, in order
    # (adapter 1, 2, ...).
    adapters: tuple[str, ...] = ()
    # For such a fine-tuned model: the spec of the model whose engine serves it (whose
    # ``adapters`` name this preset); None: an engine of its own.
    adapter_of: ModelSpec | None = None


# A fine-tuned preset's LoRA factors over its base, where its build wrote them
# (inference.building.fixer): what serving it as an adapter reads instead of the whole model.
ADAPTER_FACTORS = "adapter_factors.npz"

_engines: dict[str, tuple[ModelSpec, Engine | AdapterEngine]] = {}
# How long a process that is stopping waits for each engine's XLA call in flight before it leaves
# without finalising (exit_now): well within compose's stop grace period (10 s).
STOP_TIMEOUT_S = 2.0
# Engines shut down whose decode thread was still in an XLA call when their shutdown's timeout
# ran out (``still_running``).
_stopping: list[Engine | AdapterEngine] = []
_lock = threading.Lock()
_loading: dict[str, threading.Lock] = {}


def engine_for(spec: ModelSpec) -> Engine | AdapterEngine:
    """The running engine of this model, loading and starting it on first use (for an adapter,
    its base's engine, serving it)."""
    if spec.adapter_of is not None:
        return _adapter_engine(spec, spec.adapter_of)
    with _lock:
        loaded = _engines.get(spec.name)
        if loaded is not None and loaded[0] == spec:
            return loaded[1]
        load_lock = _loading.setdefault(spec.name, threading.Lock())
    with load_lock:  # One loader per model; other models load in parallel.
        with _lock:
            loaded = _engines.get(spec.name)
            if loaded is not None and loaded[0] == spec:
                return loaded[1]
        engine = _start_engine(spec)
        with _lock:
            previous = _engines.get(spec.name)
            _engines[spec.name] = (spec, engine)
            # Adapters served by the engine replaced: each gets the new one at its next use.
            for name in [n for n, (s, _) in _engines.items() if s.adapter_of and s.adapter_of.name == spec.name]:
                del _engines[name]
        if previous is not None:  # The roster entry changed (preset, dtype, mesh): replace it.
            previous[1].shutdown()
        return engine


def _adapter_engine(spec: ModelSpec, base: ModelSpec) -> AdapterEngine:
    """The adapter view of ``base``'s engine serving ``spec`` (its adapter ``spec.preset``)."""
    from inference.engine.adapter_engine import AdapterEngine

    if spec.preset not in base.adapters:
        raise ValueError(f"{base.name}'s engine does not serve {spec.preset} as an adapter.")
    engine = engine_for(base)
    assert not isinstance(engine, AdapterEngine), "An adapter's base is served by an engine of its own."
    with _lock:
        loaded = _engines.get(spec.name)
        view = None if loaded is None or loaded[0] != spec else loaded[1]
        if isinstance(view, AdapterEngine) and view.engine is engine:
            return view
        view = AdapterEngine(engine, base.adapters.index(spec.preset) + 1)
        _engines[spec.name] = (spec, view)
        return view


def _start_engine(spec: ModelSpec) -> Engine:
    import jax

    from inference.engine import Engine
    from inference.engine.shared_weights import share_weights
    from inference.engine.stored_dtype import narrow_embeddings
    from inference.forward import narrow_embedding_pays
    from inference.hosts import compile_cache
    from inference.hosts.sharding import load_sharded_causal_lm
    from inference.streaming import context_length

    compile_cache.enable()
    logger.info("Loading %s from %s on %d device(s)", spec.name, spec.preset, jax.device_count())
    lm = load_sharded_causal_lm(spec.preset, family=spec.family, mesh_shape=spec.mesh_shape, dtype=spec.dtype)
    # Before sharing: equal narrowed embeddings are shared too.
    if spec.embedding_dtype and narrow_embedding_pays(lm):
        narrowed = narrow_embeddings(lm, spec.embedding_dtype)
        if narrowed:
            logger.info("%s keeps its embedding in %s: %.0f MB less", spec.name, spec.embedding_dtype, narrowed / 1e6)
            return_freed_memory()
    shared = share_weights(lm)
    if shared:
        logger.info("%s shares %.0f MB of weights with a model loaded before it", spec.name, shared / 1e6)
        return_freed_memory()  # Its own copies of the shared arrays.
    context = context_length(lm)
    adapters = [adapter_factors(lm, preset) for preset in spec.adapters]
    if adapters:
        logger.info("%s serves %d adapter(s): %s", spec.name, len(adapters), ", ".join(spec.adapters))
        return_freed_memory()  # The tuned models read for their factors.
    engine = Engine(
        lm,
        slots=spec.slots,
        prefix_cache_rows=spec.prefix_cache_rows,
        prefix_cache_tokens=min(spec.prefix_cache_tokens, context // 2),
        compact=spec.compact,
        adapters=adapters,
        cache_dtype=spec.cache_dtype,
    )
    engine.start()
    return engine


def adapter_factors(lm: Any, preset: str) -> list[list[tuple[Any, Any] | None]]:
    """A model fine-tuned from ``lm`` (its preset, merged) as a LoRA adapter over ``lm``: per
    block, per kernel of the family's pass (``inference.forward.adapter_kernels``), the factors of
    its change (``inference.forward.adapters.factors_of``), None where it left the kernel as it
    was. Read from the preset's factors file where its build wrote one (``ADAPTER_FACTORS``, a few
    megabytes); else the tuned model is read whole, then dropped."""
    from pathlib import Path

    import keras_hub

    import inference.tokenizers  # noqa: F401  (the imported presets' tokenizer class)
    from inference.forward import adapter_kernels
    from inference.forward.adapters import factors_between, load_factors

    kernels = adapter_kernels(lm)
    if kernels is None:
        raise ValueError(f"{type(lm).__name__}'s forward pass takes no LoRA adapters.")
    base_kernels = kernels(lm)
    saved = Path(preset) / ADAPTER_FACTORS
    if saved.is_file():
        return load_factors(saved, [[tuple(kernel.shape) for kernel in block] for block in base_kernels])
    tuned = keras_hub.models.CausalLM.from_preset(preset)
    refused = f"{preset} is not of its base's architecture: it cannot be served as its adapter."
    if type(tuned) is not type(lm):
        raise ValueError(refused)
    try:
        return factors_between(kernels(tuned), base_kernels)
    except ValueError:
        raise ValueError(refused) from None


def running_engines() -> dict[str, Engine | AdapterEngine]:
    """The engines of this process by model name (inference.metrics reads their slots)."""
    with _lock:
        return {name: engine for name, (_, engine) in _engines.items()}


def running_specs() -> dict[str, ModelSpec]:
    """What each running engine of this process was loaded from, by model name."""
    with _lock:
        return {name: spec for name, (spec, _) in _engines.items()}


def warm_up(spec: ModelSpec) -> Engine | AdapterEngine:
    """Load the model and compile every shape its engine will use, before taking traffic."""
    engine = engine_for(spec)
    engine.warm_up()
    return_freed_memory()
    return engine


def return_freed_memory() -> None:
    """``inference.engine.heap.return_freed_memory``, imported at use: the web tier imports this
    module (``ModelSpec``) and needs nothing of the engine package."""
    from inference.engine.heap import return_freed_memory as hand_back

    hand_back()


def shutdown_all(timeout_s: float | None = None) -> int:
    """Stop every engine (:func:`shutdown_where`); how many are still in an XLA call once each had
    ``timeout_s`` (:func:`still_running`; none when ``timeout_s`` is None: each is waited for)."""
    shutdown_where(lambda spec: True, timeout_s=timeout_s)
    return still_running()


def shutdown_where(chosen: Callable[[ModelSpec], bool], timeout_s: float | None = None) -> list[str]:
    """Stop the engines of the models ``chosen`` picks and drop them, freeing their weights and
    caches once nothing else holds them (a later reply loads the model anew); their names.
    ``timeout_s``: how long to wait for each engine's decode step in flight (None: until done)."""
    with _lock:
        names = [name for name, (spec, _) in _engines.items() if chosen(spec)]
        engines = [_engines.pop(name)[1] for name in names]
        # Adapters of a stopped engine go with it.
        served = [n for n, (s, _) in _engines.items() if s.adapter_of and s.adapter_of.name in names]
        for name in served:
            del _engines[name]
    for engine in engines:
        # An adapter's stops nothing: its base's engine serves others.
        if not engine.shutdown(timeout_s):
            with _lock:
                _stopping.append(engine)
    return [*names, *served]


def still_running() -> int:
    """Engines shut down whose decode thread has not ended yet: it ends after the XLA call in
    flight (a decode step, a compilation), which nothing interrupts. A process exiting with such
    a thread must leave with :func:`exit_now`: Python's finalisation would end the thread inside
    XLA's C++ code, which aborts the process (SIGABRT, "FATAL: exception not rethrown")."""
    with _lock:
        _stopping[:] = [engine for engine in _stopping if not engine.shutdown(0)]
        return len(_stopping)


def exit_now(exitcode: int = 0) -> NoReturn:
    """Exit without Python's finalisation: the way out of a process that still has a thread in
    code that cannot be interrupted (a model loading or compiling, a decode step). Python would
    wait for such a thread if it is not a daemon, and end it inside XLA's C++ code if it is,
    which aborts the process. The caller has written everything worth keeping."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exitcode)
