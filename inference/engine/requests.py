"""A generation submitted to the engine (``Request``): its text deltas as the decode thread
produces them, its outcome and its timings, and the errors the engine raises."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from inference.engine.sampling import SamplingParams
from inference.streaming import DeltaQueue, GenerationStats, IncrementalText

EngineStopReason = Literal["stop", "length", "cancelled", "error"]


class EngineError(RuntimeError):
    """The engine's decode loop failed while a request was queued or running."""


class EngineClosedError(RuntimeError):
    """The engine was shut down: it accepts no more requests."""


class Request(DeltaQueue):
    """One generation in an Engine: iterate it for text deltas, then read its outcome.

    Iteration blocks until the decode thread produces text and ends when the generation does;
    every item is a non-empty string and their concatenation is ``text``. Iterate a request from
    one thread only (any thread). Afterwards ``stop_reason`` is "stop" (a stop token or stop
    string, not part of the text), "length" (``max_new_tokens`` or the context was used up),
    "cancelled" (``cancel()`` or engine shutdown) or "error" (the decode loop failed: iteration
    then raises EngineError), and ``stats`` holds the token count and timings measured from
    ``submit()``. A ``background`` request (an evaluation run's) yields to foreground ones
    (``inference.engine.priority``).
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
        background: bool = False,
        on_end: Callable[[], None] | None = None,
        adapter: int = 0,
    ) -> None:
        super().__init__()
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens  # Already capped by the context.
        self.sampling = sampling
        self.background = background
        self.adapter = adapter  # The engine's LoRA adapter it runs (0: the base itself).
        self.stop_reason: EngineStopReason | None = None
        self.stats = GenerationStats()
        self.error: BaseException | None = None
        self._stop_ids = stop_ids
        self._text = text
        self._wake = wake
        self._on_end = on_end
        self._submitted = time.perf_counter()
        self._cancel_requested = False
        self._slot: int | None = None
        self._position = 0  # Next cache index the decode thread will run this request at.

    @property
    def token_ids(self) -> list[int]:
        """The generated ids so far (a stop token is not included)."""
        return self._text.token_ids

    def _failure(self) -> BaseException | None:
        if self.stop_reason != "error":
            return None
        failure = EngineError(f"The engine's decode loop failed: {self.error!r}")
        failure.__cause__ = self.error
        return failure

    def cancel(self) -> None:
        """Stop at the next dispatch (or drop it from the queue); stop_reason becomes "cancelled"."""
        self._cancel_requested = True
        self._wake()

    # --- Called by the decode thread only ---------------------------------------------------

    def _emit(self, delta: str) -> None:
        self._put(delta)

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
        self._close()
        if self._on_end is not None:
            self._on_end()
