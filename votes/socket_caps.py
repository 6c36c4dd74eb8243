"""Caps on open battle sockets per voter session and per client network.

A review opened 200 sockets from one client, all accepted. Each web socket now claims a slot
under its session and one under its network (the client address truncated to /24 for IPv4,
/64 for IPv6, so that a client cannot spread over its neighbouring addresses); past either cap
the socket is refused (close code 4429, docs/protocol.md) and its slots given back.

Slots are members of a Redis sorted set per session and per network, scored by when they expire,
so that every daphne process counts the same sockets. An open socket refreshes its slots
(``REFRESH_SECONDS``); a process killed without closing its sockets leaks them only until they
expire (``SLOT_TTL_SECONDS``). Without ``REDIS_URL`` (embedded mode: one process) the sets are
kept in the process's memory. Keys are keyed hashes (votes.rate_limits.keyed_hash): neither a
session id nor an address is stored.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from votes.rate_limits import keyed_hash, network_of

SLOT_TTL_SECONDS = 90
REFRESH_SECONDS = 30


@dataclass(frozen=True)
class Refusal:
    """Why a socket was refused: ``who`` is "session" or "network"."""

    who: str
    cap: int

    @property
    def message(self) -> str:
        where = "this browser" if self.who == "session" else "your network"
        return f"Too many open arena pages from {where} (at most {self.cap}); close one and reload this page."


def slot_keys(*, session: str, address: str | None) -> list[tuple[str, str, int]]:
    """(who, Redis key, cap) of each set a socket takes a slot in; a cap of 0 is no cap."""
    keys = [("session", f"arena:sockets:session:{keyed_hash('session', session)}", settings.ARENA_SOCKETS_PER_SESSION)]
    if address:
        network = network_of(address)
        keys.append(
            ("network", f"arena:sockets:network:{keyed_hash('network', network)}", settings.ARENA_SOCKETS_PER_NETWORK)
        )
    return [key for key in keys if key[2] > 0]


class _MemorySlots:
    """The sorted sets of embedded mode, in this process: key -> {member: expiry}."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()

    def claim(self, key: str, member: str, now: float) -> int:
        with self.lock:
            slots = self.sets.setdefault(key, {})
            for stale in [m for m, expiry in slots.items() if expiry <= now]:
                del slots[stale]
            slots[member] = now + SLOT_TTL_SECONDS
            return len(slots)

    def refresh(self, key: str, member: str, now: float) -> None:
        with self.lock:
            slots = self.sets.get(key, {})
            if member in slots:
                slots[member] = now + SLOT_TTL_SECONDS

    def release(self, key: str, member: str) -> None:
        with self.lock:
            self.sets.get(key, {}).pop(member, None)


_memory = _MemorySlots()


@functools.lru_cache(maxsize=2)
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def _client() -> redis.Redis | None:
    return _redis(settings.REDIS_URL) if settings.REDIS_URL else None


def claim(member: str, *, session: str, address: str | None, now: float | None = None) -> Refusal | None:
    """Take this socket's slots (``member``: its channel name); the first cap it would pass, its
    slots given back, or None when it fits."""
    now = time.time() if now is None else now
    keys = slot_keys(session=session, address=address)
    client = _client()
    counts: list[int] = []
    for _, key, _ in keys:
        if client is None:
            counts.append(_memory.claim(key, member, now))
            continue
        pipe = client.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.zadd(key, {member: now + SLOT_TTL_SECONDS})
        pipe.zcard(key)
        pipe.expire(key, SLOT_TTL_SECONDS)
        counts.append(int(pipe.execute()[2]))
    for (who, _, cap), count in zip(keys, counts, strict=True):
        if count > cap:
            release(member, session=session, address=address)
            return Refusal(who=who, cap=cap)
    return None


def refresh(member: str, *, session: str, address: str | None, now: float | None = None) -> None:
    """Keep this open socket's slots from expiring (called every ``REFRESH_SECONDS``)."""
    now = time.time() if now is None else now
    client = _client()
    for _, key, _ in slot_keys(session=session, address=address):
        if client is None:
            _memory.refresh(key, member, now)
            continue
        pipe = client.pipeline(transaction=True)
        pipe.zadd(key, {member: now + SLOT_TTL_SECONDS}, xx=True)
        pipe.expire(key, SLOT_TTL_SECONDS)
        pipe.execute()


def release(member: str, *, session: str, address: str | None) -> None:
    """Give this socket's slots back (on disconnect, or when it was refused)."""
    client = _client()
    for _, key, _ in slot_keys(session=session, address=address):
        if client is None:
            _memory.release(key, member)
        else:
            client.zrem(key, member)
