"""A cap on the replies one client network has in flight (queued or streaming) at once.

One address at its own rate budget raised another voter's time to first text from 0.35 s to
19.8 s: its prompts filled the workers' queues. A network (votes.rate_limits.network_of: /24,
/64) may now have at most ``ARENA_REPLIES_PER_NETWORK`` replies in flight; a prompt or a
regeneration past it is refused with ``busy`` before anything is stored. With the cap below the
workers' concurrency, one network can never hold every worker, so another voter's reply starts
at once, behind at most the replies already running.

The places are checked and taken in one step (``reserve``): a reservation adds its places to the
network's count and reads the count back in one Redis transaction (or under one lock in the
process's memory without ``REDIS_URL``), and gives them back at once if that passes the cap, as
``socket_caps.claim`` does. So prompts sent at the same instant cannot all see room: of 40 sent
together from one /24 at most the cap are accepted (tests/test_reply_caps.py). Once the replies
are stored, the reservation's places become their message ids (``Reservation.record``); if the
prompt fails first, they are given back (``Reservation.release``), and a place a lost process
never gave back expires after ``RESERVATION_TTL_SECONDS``.

The ids of a network's replies are kept in a Redis set under the network's keyed hash; whether
each is still in flight is read from the database when a new one is asked for, so a reply that
ended anywhere (a worker, a lost worker, a stop) frees its place without anyone having to say so.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings

from votes import socket_caps
from votes.models import Message
from votes.protocol import ArenaError
from votes.rate_limits import keyed_hash, network_of

# A set no reply has joined for this long is dropped: no reply stays in flight that long.
KEY_TTL_SECONDS = 6 * 3600
# A reservation turns into stored replies within a second or two; one left by a lost process
# stops counting after this long.
RESERVATION_TTL_SECONDS = 120


@dataclass
class _Memory:
    """The sets in the process's memory, without ``REDIS_URL`` (one process: the embedded arena)."""

    replies: dict[str, set[int]] = field(default_factory=dict)
    reservations: dict[str, dict[str, float]] = field(default_factory=dict)  # token -> expiry
    lock: threading.Lock = field(default_factory=threading.Lock)


_memory = _Memory()


def _key(address: str) -> str:
    return f"arena:replies:network:{keyed_hash('network', network_of(address))}"


def _reservations_key(key: str) -> str:
    return f"{key}:reserved"


def _members(key: str) -> set[int]:
    client = socket_caps._client()
    if client is None:
        with _memory.lock:
            return set(_memory.replies.get(key, set()))
    return {int(member) for member in client.smembers(key)}


def _forget(key: str, ids: Iterable[int]) -> None:
    ids = list(ids)
    if not ids:
        return
    client = socket_caps._client()
    if client is None:
        with _memory.lock:
            _memory.replies.get(key, set()).difference_update(ids)
    else:
        client.srem(key, *ids)


def in_flight(address: str) -> int:
    """How many replies of this network are still queued or streaming (the finished forgotten);
    reservations not yet stored are not included."""
    key = _key(address)
    ids = _members(key)
    if not ids:
        return 0
    active = set(
        Message.objects.filter(id__in=ids).exclude(status__in=Message.FINISHED_STATUSES).values_list("id", flat=True)
    )
    _forget(key, ids - active)
    return len(active)


@dataclass
class Reservation:
    """Places taken for a prompt's replies before they are stored; ``record`` or ``release`` once."""

    key: str | None  # None: no cap applies (no address, or the cap is off).
    tokens: list[str]

    def record(self, message_ids: Iterable[int]) -> None:
        """The replies are stored: count their ids until they finish, in place of the reservation."""
        ids = [int(i) for i in message_ids]
        if self.key is None:
            return
        client = socket_caps._client()
        if client is None:
            with _memory.lock:
                if ids:
                    _memory.replies.setdefault(self.key, set()).update(ids)
                self._drop_tokens_locked()
            return
        pipe = client.pipeline(transaction=True)
        if ids:
            pipe.sadd(self.key, *ids)
            pipe.expire(self.key, KEY_TTL_SECONDS)
        if self.tokens:
            pipe.zrem(_reservations_key(self.key), *self.tokens)
        pipe.execute()
        self.tokens = []

    def release(self) -> None:
        """The prompt failed before its replies were stored: give the places back."""
        if self.key is None or not self.tokens:
            return
        client = socket_caps._client()
        if client is None:
            with _memory.lock:
                self._drop_tokens_locked()
            return
        client.zrem(_reservations_key(self.key), *self.tokens)
        self.tokens = []

    def _drop_tokens_locked(self) -> None:
        assert self.key is not None
        reserved = _memory.reservations.get(_reservations_key(self.key), {})
        for token in self.tokens:
            reserved.pop(token, None)
        self.tokens = []


def reserve(address: str | None, *, replies: int, now: float | None = None) -> Reservation:
    """Take ``replies`` places in this network's cap, checked and taken in one step; ArenaError
    "busy" (nothing taken) if they would pass it."""
    cap = settings.ARENA_REPLIES_PER_NETWORK
    if not address or cap <= 0:
        return Reservation(key=None, tokens=[])
    now = time.time() if now is None else now
    key = _key(address)
    in_flight(address)  # Forget the finished replies first: only ever frees places.
    reserved_key = _reservations_key(key)
    stem = secrets.token_hex(8)
    tokens = [f"{stem}:{i}" for i in range(replies)]
    client = socket_caps._client()
    if client is None:
        with _memory.lock:
            reserved = _memory.reservations.setdefault(reserved_key, {})
            for token, expiry in list(reserved.items()):
                if expiry <= now:
                    del reserved[token]
            taken = len(_memory.replies.get(key, set())) + len(reserved)
            if taken + replies <= cap:
                reserved.update(dict.fromkeys(tokens, now + RESERVATION_TTL_SECONDS))
                return Reservation(key=key, tokens=tokens)
    else:
        pipe = client.pipeline(transaction=True)
        pipe.zremrangebyscore(reserved_key, "-inf", now)
        pipe.zadd(reserved_key, dict.fromkeys(tokens, now + RESERVATION_TTL_SECONDS))
        pipe.expire(reserved_key, RESERVATION_TTL_SECONDS)
        pipe.zcard(reserved_key)
        pipe.scard(key)
        *_, reserved_count, replies_count = pipe.execute()
        if int(reserved_count) + int(replies_count) <= cap:
            return Reservation(key=key, tokens=tokens)
        client.zrem(reserved_key, *tokens)
    raise ArenaError(
        "busy",
        f"Your network already has {cap} replies being generated; wait for one to finish, then send again.",
    )
