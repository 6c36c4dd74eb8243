"""Live replies first: the process-wide count of foreground requests that background ones yield to.

A request is foreground (a battle's reply, a direct chat's, a host's HTTP answer) or background
(an evaluation run's). Every engine of the process reads one ``Foreground`` count of the
foreground requests queued or running on any engine, and while it is not zero:

- an engine admits no background request into a slot (its prefill would hold up the decode
  loop, and on a host whose engines share the CPU cores, every other engine's steps);
- an engine whose running slots are all background dispatches nothing: its requests wait where
  they are, their caches kept, and go on from there once the count falls to zero.

A background request beside a foreground one in the same engine keeps running: a decode step
computes every slot, busy or not, so it costs the foreground reply nothing. What is left is at
most one dispatch already under way when a live request arrives (about ``DISPATCH_TARGET_S``).
``manage.py bench_live_priority`` measures what an evaluation run costs a live reply.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class _Wakeable(Protocol):
    def _wake(self) -> None: ...


class Foreground:
    """How many foreground requests are queued or running; engines subscribe to hear it change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._engines: weakref.WeakSet[_Wakeable] = weakref.WeakSet()

    @property
    def active(self) -> bool:
        """Whether a foreground request is queued or running on any engine of the process."""
        return self._count > 0

    @property
    def count(self) -> int:
        return self._count

    def subscribe(self, engine: _Wakeable) -> None:
        """``engine._wake()`` is called whenever the count starts or stops being zero."""
        with self._lock:
            self._engines.add(engine)

    def enter(self) -> None:
        with self._lock:
            self._count += 1
            changed = self._count == 1
            engines = list(self._engines) if changed else []
        for engine in engines:
            engine._wake()

    def leave(self) -> None:
        with self._lock:
            if self._count == 0:
                raise RuntimeError("Foreground.leave() without a matching enter().")
            self._count -= 1
            changed = self._count == 0
            engines = list(self._engines) if changed else []
        for engine in engines:
            engine._wake()


FOREGROUND = Foreground()
