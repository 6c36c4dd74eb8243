"""The engine's scheduler: ``Engine`` owns the slots and a decode thread that admits queued
requests into free slots (prefill, insert), advances every running slot with one jitted generate
step per dispatch, frees slots as their requests end and sizes the caches' window to what the
running requests need (``inference.engine`` describes the design)."""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.engine.heap import return_freed_memory
from inference.engine.prefix_cache import NO_MATCH, PrefixCache
from inference.engine.priority import FOREGROUND
from inference.engine.programs import CHUNK_FIELDS, programs_for
from inference.engine.requests import EngineClosedError, EngineError, EngineStopReason, Request
from inference.engine.sampling import GREEDY, SamplingParams, slot_params
from inference.engine.shapes import (
    FINE_BUCKETS_UP_TO,
    compact_buckets,
    compact_windows,
    default_buckets,
    default_windows,
    sizes,
)
from inference.forward.adapters import stack_adapters
from inference.streaming import (
    MIN_BUCKET,
    IncrementalText,
    _model_state,
    context_length,
    encode_prompt,
    stop_token_ids,
)

if TYPE_CHECKING:
    import keras_hub

logger = logging.getLogger(__name__)

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
# How long the decode thread waits for a new request after one ends (see _await_resubmission):
# well under one dispatch (about 1 ms with the strong demo model on 2 CPU cores).
RESUBMIT_GRACE_S = 0.0003
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


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
    adapters: Any = ()  # The engine's stacked LoRA factors (inference.forward.adapters), or ().


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


class Engine:
    """A continuous-batching generation engine for one keras-hub CausalLM (``inference.engine`` explains it).

    ``slots``: requests decoded together (more wait in a queue). ``buckets``: padded prompt
    lengths for prefill (default ``default_buckets``). ``windows``: how much of the cache a
    decode step attends over, the smallest that holds every running request's positions
    (default ``default_windows``). The context length is always added to both, so every prompt
    that leaves room for one new token is served. ``compact``: powers of two only for both
    (``compact_buckets``, ``compact_windows``: no window below ``COMPACT_SMALLEST_WINDOW``), no
    short prefix, and the kernels multiplied as they lie (no second copy in the layout that
    ``inference.forward.llama.faster_layout`` would time faster): fewer programs, less of their
    memory, and the weights held once. ``steps_per_dispatch``: tokens per slot per jitted call,
    at most (default: adaptive, see ``DISPATCH_TARGET_S``). Each bucket and each window is one
    compilation, all done by ``warm_up()``.

    ``adapters``: LoRA adapters served unmerged over the model's own kernels, numbered from 1 in
    this order (``submit(adapter=...)``; 0 is the model itself), each given per block, per kernel
    of its family's ``block_kernels``, as ``inference.forward.adapters.factors_of`` gives them or
    None where it leaves a kernel as it is. Requests of different adapters share decode steps,
    each row running its own; the Llama 3, Mistral and Gemma 3 passes take them.

    ``prefix_cache_rows`` prompt prefixes of up to ``prefix_cache_tokens`` tokens (default half
    the context, at most 1024) are kept on the device (see ``inference.engine.prefix_cache``): a prompt
    that starts like a recent one (same template and system prompt, or the same dialog one turn
    later) is prefilled from where the cached prefix ends. 0 rows turns it off; families without
    an in-place forward pass (see ``in_place_decoder``) always prefill whole prompts.

    ``cache_dtype``: the dtype the in-place families keep keys and values in (slots, staging row,
    prefix pool), e.g. "float16" for a float32 model: half their memory, each key and value
    rounded once (``inference.forward.attention``, which says why not bfloat16 on a CPU); None:
    the model's. Other families keep keras-hub's cache in the model's dtype.

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
        compact: bool = False,
        adapters: Sequence[Sequence[Sequence[tuple[Any, Any] | None]]] = (),
        cache_dtype: str | None = None,
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
        # Compact: the forward pass multiplies by the model's kernels as they lie, never by a
        # second copy laid out otherwise (see Engine's docstring).
        self._programs = programs_for(
            lm, slots, self.max_steps_per_dispatch, context, prefix_cache_rows, capacity, cache_dtype, not compact
        )
        self.in_place = self._programs.in_place
        if adapters and not self._programs.adapters:
            raise ValueError(f"{type(lm).__name__}'s forward pass takes no LoRA adapters.")
        if any(len(adapter) != lm.backbone.num_layers for adapter in adapters):
            raise ValueError(f"An adapter needs factors for each of the model's {lm.backbone.num_layers} blocks.")
        self.adapter_count = len(adapters)
        self._adapter_factors = stack_adapters(adapters) if adapters else ()
        self.prefix_cache = PrefixCache(prefix_cache_rows if self.in_place else 0, capacity, PREFIX_BLOCK)
        smallest = PREFIX_BLOCK if self.in_place else MIN_BUCKET
        fine_up_to = FINE_BUCKETS_UP_TO if self.in_place else 0
        # Compact: no short prefix (a chunk after a cached prefix attends over the whole pool row
        # and its own positions): one prefill program per chunk length.
        self._short_prefixes = () if compact else SHORT_PREFIXES
        if compact:
            bucket_lengths, window_lengths = compact_buckets(context, smallest), compact_windows(context)
        else:
            bucket_lengths, window_lengths = default_buckets(context, smallest, fine_up_to), default_windows(context)
        self.buckets = sizes("buckets", buckets, bucket_lengths, context)
        self.windows = sizes("windows", windows, window_lengths, context)
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
        self._freed_since_rest = False  # Slots freed since the engine last went idle (_rest).
        FOREGROUND.subscribe(self)

    # --- Public API -------------------------------------------------------------------------

    @property
    def forward_layout(self) -> str | None:
        """The Llama pass's layout, "token-major" or "feature-major" (timed when the engine's
        programs were built: ``inference.forward.llama.faster_layout``); None for the others."""
        return self._programs.layout

    @property
    def cache_dtype(self) -> str:
        """The dtype its caches hold keys and values in."""
        return str(self._programs.cache_dtype)

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
    def yielding(self) -> bool:
        """Whether the engine holds its running background requests (an evaluation run's) while
        foreground work runs elsewhere in the process (``inference.engine.priority``)."""
        with self._cond:
            return self._yielding()

    @property
    def queued(self) -> int:
        """Submitted requests waiting for a free slot."""
        return len(self._pending)

    def active_slots_of(self, adapter: int) -> int:
        """Slots holding a running request of ``adapter`` (0: the model itself)."""
        return sum(r is not None and r.adapter == adapter for r in self._slots)

    def queued_of(self, adapter: int) -> int:
        """Requests of ``adapter`` waiting for a free slot."""
        return sum(r.adapter == adapter for r in list(self._pending))

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
        background: bool = False,
        adapter: int = 0,
    ) -> Request:
        """Queue a generation; iterate the returned Request for its text deltas.

        ``stop_strings`` that are single tokens stop on the token, and every stop string is also
        matched in the text; neither appears in the output. The tokenizer's end token(s) always
        stop. ``ignore_stop_tokens`` makes no token stop the generation (stop strings still cut
        and end the text): benchmarks use it to generate exactly ``max_new_tokens``. A
        ``background`` request waits while any foreground one of the process is queued or
        running (``inference.engine.priority``). ``adapter``: which of the engine's LoRA
        adapters generates it (0: the model itself). The reply is capped by the context
        (``Request.max_new_tokens`` is the effective limit). Raises ValueError for an invalid
        request (nothing is queued), EngineClosedError after ``shutdown()`` and EngineError if
        the decode thread died.
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
        if not isinstance(adapter, int) or isinstance(adapter, bool) or not 0 <= adapter <= self.adapter_count:
            raise ValueError(f"adapter must be an integer within 0..{self.adapter_count}, got {adapter!r}.")
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
            background=background,
            on_end=None if background else FOREGROUND.leave,
            adapter=adapter,
        )
        with self._cond:
            self._check_open()
            self._pending.append(request)
            if not background:
                FOREGROUND.enter()
            self._cond.notify_all()
        self.start()
        return request

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the decode thread; running and queued requests end as "cancelled". Idempotent.
        Whether the thread has ended: it ends after the XLA call in flight (a step, a compile),
        which nothing interrupts, so within ``timeout`` it may not have."""
        with self._cond:
            self._closing = True
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        self._end_all("cancelled")
        return True

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

    def _runnable(self) -> bool:
        """Whether a queued or running request may go on now: background ones wait while a
        foreground request of the process is queued or running (``inference.engine.priority``).
        A cancelled one always may (it ends). Called with ``_cond`` held."""
        yielding = FOREGROUND.active
        return any(
            request is not None and (not request.background or not yielding or request._cancel_requested)
            for request in (*self._pending, *self._slots)
        )

    def _admit(self, free: int) -> list[Request]:
        """Take up to ``free`` queued requests for the free slots: foreground ones first, in
        order, then background ones unless a foreground request of the process is queued or
        running. Called with ``_cond`` held."""
        admitted = [r for r in self._pending if not r.background][:free]
        if len(admitted) < free and not FOREGROUND.active:
            admitted += [r for r in self._pending if r.background][: free - len(admitted)]
        for request in admitted:
            self._pending.remove(request)
        return admitted

    def _release_cancelled(self) -> list[Request]:
        """Free the slots of cancelled requests that no dispatch will see (an engine yielding
        to foreground work dispatches nothing): the requests, to end."""
        cancelled = [r for r in self._slots if r is not None and r._cancel_requested]
        for request in cancelled:
            self._release(request)
        return cancelled

    def _yielding(self) -> bool:
        """Whether every running slot is background work while foreground work runs elsewhere in
        the process: then nothing is dispatched, and the slots keep their place. Called with
        ``_cond`` held."""
        running = [r for r in self._slots if r is not None]
        if not running or not FOREGROUND.active or not all(r.background for r in running):
            return False
        # Foreground work queued here with every slot taken: the background slots run on to free one.
        return len(running) < self.slots or all(r.background for r in self._pending)

    def _reset_device(self) -> None:
        state = _model_state(self.lm)
        self._window = self.windows[0]
        cache, staging, slot_state, pool = self._programs.init(state, self._window)
        import jax

        adapters = jax.tree_util.tree_map(jax.device_put, self._adapter_factors)
        self._device = _DeviceState(state, cache, staging, slot_state, pool, self._programs.laid_out(state), adapters)
        self.prefix_cache.clear()

    def _run(self) -> None:
        """The decode thread: admit, dispatch, process, until shutdown."""
        _compile_owner.engine = self
        try:
            self._reset_device()
            in_flight: _Dispatch | None = None
            while True:
                with self._cond:
                    while not (self._closing or self._jobs or in_flight is not None or self._runnable()):
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
                        admitted = self._admit(len(free))
                if in_flight is None:  # Background slots held while live replies run elsewhere.
                    cancelled += self._release_cancelled()
                for request in cancelled:
                    request._end("cancelled")
                try:
                    self._freed = 0
                    in_flight = self._iterate(admitted, free, jobs, in_flight)
                    if self._freed and in_flight is not None:
                        self._await_resubmission()
                    if in_flight is None and self._freed_since_rest and not any(self._slots):
                        self._rest()
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
        with self._cond:
            yielding = self._yielding()
        running = [] if yielding else [r for r in owners if r is not None]
        count = self.steps_per_dispatch
        resized = False
        if running:
            # The smallest window that holds every position this dispatch writes.
            needed = max(r._position for r in running) + count
            resized = self._resize(next((w for w in self.windows if w >= needed), self.context_length))
        for request in admitted:
            assert request._slot is not None
            self._prefill(request.prompt_ids, request._slot, request.sampling, adapter=request.adapter)
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
                return_freed_memory()
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
            return_freed_memory()
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

    def _rest(self) -> None:
        """The engine has gone idle after requests: its slot caches back to the smallest window,
        and what the larger ones and the requests' prefills held handed back to the system
        (``inference.engine.heap``), so that an idle engine holds no more than a warm one."""
        import jax

        device = self._device
        assert device is not None
        self._resize(self.windows[0])
        jax.block_until_ready(device.cache)  # The larger caches are freed once it has run.
        return_freed_memory()
        self._freed_since_rest = False

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
            device.state,
            device.weights,
            device.adapters,
            device.cache,
            device.slot_state,
            active,
            self._input(count, np.int32),
        )
        return out

    def _pool_lengths(self) -> tuple[int, ...]:
        """The prefix lengths compiled for: ``SHORT_PREFIXES`` and a whole pool row."""
        capacity = self.prefix_cache.capacity  # Positions of a prefix pool row.
        return tuple(sorted({min(short, capacity) for short in self._short_prefixes} | {capacity}))

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
        adapter: int = 0,
    ) -> None:
        """Dispatch the prefill of a prompt's keys and values (all but its last token's) into
        the staging row, and start ``slot`` from its last token; ``_insert`` then copies the
        staging row to the slot, and the slot's first decode step gives the first new token.

        In-place families start from the longest cached prefix (leaving at least the last
        token to run) and keep the prompt's prefix for later prompts, of its ``adapter``.
        ``bucket`` and ``prefix`` force a compiled shape (warm-up: a two-token prompt, nothing
        cached).
        """
        programs = self._programs
        device = self._device
        assert device is not None
        length = len(prompt_ids)
        params = slot_params(sampling)
        if not self.in_place:
            bucket = bucket or next(b for b in self.buckets if b >= length)
            token_ids = np.full((1, bucket), self._pad_id, dtype=np.int32)
            token_ids[0, :length] = prompt_ids
            device.staging, device.slot_state = programs.prefill(
                device.state, device.staging, device.slot_state, token_ids, np.int32(length), np.int32(slot), *params
            )
            return
        match = NO_MATCH if bucket else self.prefix_cache.lookup(prompt_ids, limit=length - 1, adapter=adapter)
        size = bucket or next(b for b in self.buckets if b >= max(length - 1 - match.length, 1))
        if match.length + size > self.context_length:  # The chunk would not fit after the prefix.
            match = NO_MATCH
            size = next(b for b in self.buckets if b >= max(length - 1, 1))
        # The prefill computes every position but the last token's: only those can be kept.
        row = None if bucket else self.prefix_cache.store(prompt_ids[:-1], match, adapter=adapter)
        integers = np.full(size + CHUNK_FIELDS, self._pad_id, dtype=np.uint32)
        integers[: length - 1 - match.length] = prompt_ids[match.length : length - 1]
        temperature, top_k, top_p, key = params
        integers[size:] = (prompt_ids[-1], match.length, length, slot, match.entry, top_k, *key, adapter)
        prefix = prefix or next(p for p in self._prefixes(size) if p >= match.length)
        device.staging, device.slot_state = programs.prefill_chunk(
            device.state,
            device.weights,
            device.adapters,
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
            self._freed_since_rest = True

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
