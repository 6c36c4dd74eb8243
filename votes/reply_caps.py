"""A cap on the replies one client network has in flight (queued or streaming) at once.

One address at its own rate budget raised another voter's time to first text from 0.35 s to
19.8 s: its prompts filled the workers' queues. A network (votes.socket_caps.network_of: /24,
/64) may now have at most ``ARENA_REPLIES_PER_NETWORK`` replies in flight; a prompt or a
regeneration past it is refused with ``busy`` before anything is stored. With the cap below the
workers' concurrency, one network can never hold every worker, so another voter's reply starts
at once, behind at most the replies already running.

The ids of a network's replies are kept in a Redis set (in the process's memory without
``REDIS_URL``) under the network's keyed hash; whether each is still in flight is read from the
database when a new one is asked for, so a reply that ended anywhere (a worker, a lost worker, a
stop) frees its place without anyone having to say so.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from django.conf import settings

from votes import socket_caps
from votes.models import Message
from votes.protocol import ArenaError
from votes.rate_limits import keyed_hash

# A set no reply has joined for this long is dropped: no reply stays in flight that long.
KEY_TTL_SECONDS = 6 * 3600

_memory: dict[str, set[int]] = {}
_memory_lock = threading.Lock()


def _key(address: str) -> str:
    return f"arena:replies:network:{keyed_hash('network', socket_caps.network_of(address))}"


def _members(key: str) -> set[int]:
    client = socket_caps._client()
    if client is None:
        with _memory_lock:
            return set(_memory.get(key, set()))
    return {int(member) for member in client.smembers(key)}


def _forget(key: str, ids: Iterable[int]) -> None:
    ids = list(ids)
    if not ids:
        return
    client = socket_caps._client()
    if client is None:
        with _memory_lock:
            _memory.get(key, set()).difference_update(ids)
    else:
        client.srem(key, *ids)


def in_flight(address: str) -> int:
    """How many replies of this network are still queued or streaming (the finished forgotten)."""
    key = _key(address)
    ids = _members(key)
    if not ids:
        return 0
    active = set(
        Message.objects.filter(id__in=ids).exclude(status__in=Message.FINISHED_STATUSES).values_list("id", flat=True)
    )
    _forget(key, ids - active)
    return len(active)


def check(address: str | None, *, replies: int) -> None:
    """ArenaError "busy" if ``replies`` more would pass this network's cap."""
    cap = settings.ARENA_REPLIES_PER_NETWORK
    if not address or cap <= 0:
        return
    if in_flight(address) + replies > cap:
        raise ArenaError(
            "busy",
            f"Your network already has {cap} replies being generated; wait for one to finish, then send again.",
        )


def record(address: str | None, message_ids: Iterable[int]) -> None:
    """Count these new replies against the network until they finish."""
    ids = [int(i) for i in message_ids]
    if not address or not ids or settings.ARENA_REPLIES_PER_NETWORK <= 0:
        return
    key = _key(address)
    client = socket_caps._client()
    if client is None:
        with _memory_lock:
            _memory.setdefault(key, set()).update(ids)
        return
    pipe = client.pipeline(transaction=True)
    pipe.sadd(key, *ids)
    pipe.expire(key, KEY_TTL_SECONDS)
    pipe.execute()
