"""What every model client offers (``inference.services.ModelReply`` uses it): plain Python, no Django, no JAX."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from inference.chat_templates import ChatTurn
from inference.streaming import GenerationStats, Tick

StopReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class Sampling:
    """How a reply picks its tokens (temperature 0 is greedy; top_k 0 and top_p 1 do not limit)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1 or self.top_p == 0


GREEDY = Sampling()


class Generation(Protocol):
    """One reply on its way: iterate ``deltas`` for its text, then read its outcome.

    ``deltas(tick)`` yields non-empty text deltas as they come and, with a ``tick``, an empty
    string whenever ``tick`` seconds pass without one (``tick`` may be a function giving the
    seconds to the next, asked before each wait); it ends when the reply does and raises if
    the reply failed. Afterwards ``stop_reason`` is "stop", "length", "cancelled" or "error" and
    ``stats`` holds the token count and timings. ``cancel()`` may be called from any thread;
    iterating after it waits until the host has let the reply go.
    """

    text: str
    stop_reason: StopReason | None
    stats: GenerationStats

    def deltas(self, tick: Tick) -> Iterator[str]: ...

    def __iter__(self) -> Iterator[str]: ...

    def result(self, timeout: float | None = None) -> str: ...

    def cancel(self) -> None: ...


class ModelClient(Protocol):
    """Where one roster model is served."""

    @property
    def context_length(self) -> int:
        """Tokens of prompt plus reply the model takes."""
        ...

    def prompt_tokens(self, system: str | None, turns: Sequence[ChatTurn]) -> int:
        """How many tokens this conversation takes in the model's context (an upper bound where
        the client cannot tokenize)."""
        ...

    def submit(
        self,
        system: str | None,
        turns: Sequence[ChatTurn],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        background: bool = False,
    ) -> Generation:
        """Start the model's reply to the conversation. Raises ValueError for a conversation the
        model cannot take (nothing was sent). A ``background`` reply (an evaluation run's) yields
        to live ones where the client can say so (the arena's own engines)."""
        ...
