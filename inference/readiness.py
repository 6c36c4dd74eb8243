"""Which roster models are ready to answer: loaded, compiled and served by a live host.

Whoever serves a model says so here: the embedded arena's warm-up (``inference.warming``), an
inference host once it has warmed its models, and the endpoint check for models served
elsewhere (a server that lists the model in ``GET /models``). Each report is kept in Django's
cache (Redis in production, so every web process reads the hosts' reports; this process's
memory in the embedded mode) for ``ARENA_MODEL_STATE_TTL_SECONDS``, and a live host repeats it
every third of that: a host that died stops counting as ready within that time.

The web tier reads the states to draw anonymous battles among ready models only
(``ARENA_READY_MODELS_ONLY``), to say in its pages and in ``GET /api/v1/models`` which models are
ready, and to refuse a named battle or direct chat with a model that is not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from django.conf import settings
from django.core.cache import cache

_KEY = "arena:model-state:{}"


class State(StrEnum):
    UNKNOWN = "unknown"  # No live host has reported it (not started, or its host stopped).
    LOADING = "loading"  # A host is loading and compiling it.
    READY = "ready"  # Warm: its first reply starts at once.
    FAILED = "failed"  # Its host could not load it (the detail says why).


@dataclass(frozen=True)
class ModelState:
    state: State
    since: float | None = None  # Unix time the state began (None: unknown).
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.state is State.READY


UNKNOWN = ModelState(State.UNKNOWN)


def _ttl() -> float:
    return settings.ARENA_MODEL_STATE_TTL_SECONDS


def report(name: str, state: State, *, detail: str = "") -> None:
    """Say that this process serves ``name`` in ``state``; repeat within the TTL to keep it.
    The time the state began is kept across repeats of the same state."""
    key = _KEY.format(name)
    now = time.time()
    previous = cache.get(key)
    since = previous["since"] if previous and previous.get("state") == state.value else now
    cache.set(key, {"state": state.value, "since": since, "at": now, "detail": detail[:300]}, timeout=_ttl())


def forget(name: str) -> None:
    """This process no longer serves ``name`` (its engine was shut down)."""
    cache.delete(_KEY.format(name))


def states(names: Iterable[str], *, now: float | None = None) -> dict[str, ModelState]:
    """The state of each of ``names``; a report older than the TTL counts as unknown."""
    names = list(names)
    found = cache.get_many([_KEY.format(name) for name in names])
    now = time.time() if now is None else now
    result = {}
    for name in names:
        entry = found.get(_KEY.format(name))
        if entry is None or now - entry["at"] > _ttl():
            result[name] = UNKNOWN
        else:
            result[name] = ModelState(State(entry["state"]), entry["since"], entry.get("detail", ""))
    return result


def ready_names(names: Iterable[str]) -> set[str]:
    return {name for name, state in states(names).items() if state.ready}


def required() -> bool:
    """Whether battles use ready models only (``ARENA_READY_MODELS_ONLY``)."""
    return settings.ARENA_READY_MODELS_ONLY
