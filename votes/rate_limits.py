"""Rate limits on battles, messages and votes, per voter session and per client network.

Each action has a budget per session and a larger one per network (several voters can share a
network; the network is the address's /24 or /64, as for the socket and reply caps, so a client
cannot spread over its neighbouring addresses) over a sliding window, counted in Django's cache:
Redis in production, so every web process shares the counts; the process's memory in embedded
mode. Counters are keyed by keyed hashes (HMAC with ``SECRET_KEY``): neither a session id nor an
address nor a network is ever stored.

The window slides (the sliding-window counter): a count is kept per fixed window, and the
previous window's count weighs as much as it still overlaps the last ``window_s`` seconds. With
fixed windows a burst across a boundary passed twice the budget (101 messages in about 70 s
against 80 a minute); here the previous window's messages still count just after it ends.

``ARENA_RATE_LIMITS`` configures them: ``action=per_session/per_network/window_seconds`` items
separated by commas, e.g. ``battle=30/120/3600,message=20/80/60,vote=60/240/60,frame=240/2400/60``; an action left
out keeps its default, and 0 turns a budget off. New page sessions are budgeted per network too
(``ARENA_NEW_SESSIONS_PER_NETWORK`` an hour, ``new_session``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from arena_site.networks import client_network
from votes.protocol import ArenaError


@dataclass(frozen=True)
class Limit:
    per_session: int
    per_network: int
    window_s: int


DEFAULT_LIMITS: dict[str, Limit] = {
    "battle": Limit(per_session=30, per_network=120, window_s=3600),  # Battles started.
    "message": Limit(per_session=20, per_network=80, window_s=60),  # Prompts and regenerations.
    "vote": Limit(per_session=60, per_network=240, window_s=60),  # Votes and ratings.
    # Every frame a page sends, of any type (sync and malformed ones included): a page sends a
    # few a minute, a script that floods the socket is stopped.
    "frame": Limit(per_session=240, per_network=2400, window_s=60),
}
_WHAT = {"battle": "new battles", "message": "messages", "vote": "votes and ratings", "frame": "requests"}


def parse_limits(text: str) -> dict[str, Limit]:
    """``DEFAULT_LIMITS`` overridden by an ``ARENA_RATE_LIMITS`` value; ValueError if malformed."""
    limits = dict(DEFAULT_LIMITS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        action, _, numbers = item.partition("=")
        action = action.strip()
        if action not in DEFAULT_LIMITS:
            raise ValueError(f"ARENA_RATE_LIMITS: unknown action {action!r}; expected one of {sorted(DEFAULT_LIMITS)}.")
        try:
            per_session, per_network, window_s = (int(n) for n in numbers.split("/"))
        except ValueError:
            raise ValueError(
                f"ARENA_RATE_LIMITS: {item!r} is not action=per_session/per_network/window_seconds."
            ) from None
        if min(per_session, per_network) < 0 or window_s < 1:
            raise ValueError(f"ARENA_RATE_LIMITS: {item!r} needs budgets >= 0 and a window >= 1 second.")
        limits[action] = Limit(per_session, per_network, window_s)
    return limits


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> dict[str, Limit]:
    return parse_limits(text)


def limits() -> dict[str, Limit]:
    """The configured limits (``settings.ARENA_RATE_LIMITS``)."""
    return _parsed(settings.ARENA_RATE_LIMITS)


def keyed_hash(kind: str, value: str) -> str:
    """What a counter is keyed by instead of ``value`` (a session id or an address)."""
    digest = hmac.new(settings.SECRET_KEY.encode(), f"rate:{kind}:{value}".encode(), hashlib.sha256)
    return digest.hexdigest()[:32]


def counter_key(action: str, kind: str, value: str, window: int | None) -> str:
    """The cache key of a window's count (``window``: its number), or, with None, what ``spend``
    appends the window number to."""
    counter = f"arena:rate:{action}:{kind}:{keyed_hash(kind, value)}"
    return counter if window is None else f"{counter}:{window}"


def network_of(address: str) -> str:
    """The network an address counts under (arena_site.networks.client_network: its /24 or
    /64); anything that is not an address (a test client's name) as itself."""
    return client_network(address) or address


def hit(action: str, *, session: str, address: str | None, now: float | None = None) -> None:
    """Count one ``action`` by this session and the address's network; ArenaError
    "rate_limited" if over budget.

    A refused attempt still counts: hammering does not reset the window.
    """
    limit = limits()[action]
    now = time.time() if now is None else now
    budgets = [("session", session, limit.per_session)]
    if address:
        budgets.append(("network", network_of(address), limit.per_network))
    for kind, value, budget in budgets:
        if budget == 0:
            continue
        wait = spend(counter_key(action, kind, value, window=None), budget, limit.window_s, now)
        if wait is not None:
            who = "this page" if kind == "session" else "your network"
            raise ArenaError("rate_limited", f"Too many {_WHAT[action]} from {who}; try again in {wait} s.")


def new_session(address: str | None, now: float | None = None) -> int | None:
    """Count one new page session against its network's hourly budget
    (``ARENA_NEW_SESSIONS_PER_NETWORK``; 0: none): None while within it, else the seconds until
    one more fits. Page views that do not create a session are not counted."""
    budget = settings.ARENA_NEW_SESSIONS_PER_NETWORK
    if not address or budget <= 0:
        return None
    return spend(counter_key("new_session", "network", network_of(address), window=None), budget, 3600, now)


def spend(counter: str, budget: int, window_s: int, now: float | None = None) -> int | None:
    """Count one against ``budget`` over a sliding window of ``window_s`` seconds, in the cache
    under ``counter:<window number>``: None while within it, else the seconds until one more
    fits. A refused one still counts. The count is an atomic increment, so concurrent requests
    (several web processes on one Redis) cannot slip past it. Also the research API's throttle
    (arena_site.api_common)."""
    now = time.time() if now is None else now
    window = int(now // window_s)
    into = now / window_s - window  # How far into its window ``now`` is, 0..1.
    key = f"{counter}:{window}"
    # Kept two windows: the next window reads it as its previous one.
    cache.add(key, 0, timeout=2 * window_s + 1)
    try:
        count = cache.incr(key)
    except ValueError:  # Expired between add and incr: start the window again.
        cache.set(key, 1, timeout=2 * window_s + 1)
        count = 1
    previous = cache.get(f"{counter}:{window - 1}") or 0
    if previous * (1 - into) + count > budget:
        return _retry_after(window_s, into, count, previous, budget)
    return None


def _retry_after(window_s: int, into: float, count: int, previous: int, budget: int) -> int:
    """Seconds until one more action fits: until enough of the previous window has slid out, or,
    where this window alone holds the budget, until the next window's previous weighs little."""
    if count <= budget and previous:
        # previous * (1 - into') + count <= budget, at into' = 1 - (budget - count) / previous.
        wait = (1 - (budget - count) / previous - into) * window_s
    else:
        # This window alone is over: in the next, its count weighs count * (1 - into'') and
        # fits once into'' = 1 - budget / count.
        wait = (1 - into) * window_s + (1 - budget / count) * window_s
    return max(1, int(wait) + 1)
