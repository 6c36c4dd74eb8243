"""One client cannot hold the server's sockets: open battle sockets are capped per voter session
and per client network (/24, /64) across processes (votes/socket_caps.py, counted in Redis); past a
cap a socket gets a clear error and close code 4429, and closing one frees its slot."""

import json
import secrets
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.backends.db import SessionStore

from tests.conftest import fresh_network, new_session, open_battle_socket
from votes import socket_caps
from votes.consumers import TOO_MANY_SOCKETS
from votes.services import voter_key_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("address", "network"),
    [
        ("203.0.113.77", "203.0.113.0/24"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.9", "198.51.100.0/24"),
        ("testclient", "testclient"),
    ],
)
def test_an_address_counts_under_its_network(address: str, network: str) -> None:
    assert socket_caps.network_of(address) == network


def test_a_crashed_process_leaks_its_slots_only_until_they_expire(settings: Any) -> None:
    settings.ARENA_SOCKETS_PER_SESSION = 1
    session = f"session-{secrets.token_hex(8)}"
    assert socket_caps.claim("crashed-socket", session=session, address=None, now=1_000.0) is None
    refusal = socket_caps.claim("next-socket", session=session, address=None, now=1_000.0 + 1)
    assert refusal is not None and refusal.who == "session"
    # Never released nor refreshed: after the slot's lifetime the next socket fits.
    later = 1_000.0 + socket_caps.SLOT_TTL_SECONDS + 1
    assert socket_caps.claim("next-socket", session=session, address=None, now=later) is None
    # A refreshed slot does not expire.
    socket_caps.refresh("next-socket", session=session, address=None, now=later + 60)
    refusal = socket_caps.claim("third", session=session, address=None, now=later + socket_caps.SLOT_TTL_SECONDS + 1)
    assert refusal is not None


async def open_socket(session: SessionStore, address: str) -> tuple[WebsocketCommunicator, bool]:
    """A battle socket from ``address``; whether it was kept open (False: refused with 4429)."""
    communicator = await open_battle_socket(session, address=address)  # Accepted, then maybe refused.
    if await communicator.receive_nothing(timeout=0.3):
        return communicator, True
    frame = json.loads(await communicator.receive_from())
    assert frame["type"] == "error" and frame["code"] == "too_many_sockets", frame
    assert "Too many open arena pages" in frame["message"]
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": TOO_MANY_SOCKETS}
    await communicator.disconnect()
    return communicator, False


async def close_all(sockets: list[WebsocketCommunicator]) -> None:
    for communicator in sockets:
        await communicator.disconnect()


async def test_a_session_opens_its_cap_of_sockets_and_no_more(settings: Any) -> None:
    settings.ARENA_SOCKETS_PER_SESSION = 3
    settings.ARENA_SOCKETS_PER_NETWORK = 100
    session, network = await sync_to_async(new_session)(), fresh_network()
    sockets = []
    for host in range(3):
        communicator, kept = await open_socket(session, f"{network}.{host + 1}")
        assert kept
        sockets.append(communicator)
    # The fourth, even from another network, is refused; another voter is not.
    assert not (await open_socket(session, f"{fresh_network()}.1"))[1]
    other, kept = await open_socket(await sync_to_async(new_session)(), f"{network}.9")
    assert kept
    # Closing one frees its slot.
    await sockets.pop().disconnect()
    communicator, kept = await open_socket(session, f"{network}.4")
    assert kept
    await close_all([*sockets, communicator, other])


async def test_a_network_opens_its_cap_of_sockets_and_no_more(settings: Any) -> None:
    """200 sockets from one client were accepted: fresh sessions and neighbouring addresses of
    one /24 now share one cap."""
    settings.ARENA_SOCKETS_PER_SESSION = 100
    settings.ARENA_SOCKETS_PER_NETWORK = 4
    network = fresh_network()
    sockets = []
    for host in range(4):
        communicator, kept = await open_socket(await sync_to_async(new_session)(), f"{network}.{host + 1}")
        assert kept
        sockets.append(communicator)
    assert not (await open_socket(await sync_to_async(new_session)(), f"{network}.200"))[1]
    other, kept = await open_socket(await sync_to_async(new_session)(), f"{fresh_network()}.1")  # Another network.
    assert kept
    await sockets.pop(0).disconnect()
    communicator, kept = await open_socket(await sync_to_async(new_session)(), f"{network}.201")
    assert kept
    await close_all([*sockets, communicator, other])


async def test_slots_are_counted_in_redis_for_every_process(settings: Any) -> None:
    """What another daphne process claimed (here: claimed directly in Redis) counts here too."""
    settings.ARENA_SOCKETS_PER_SESSION = 2
    session, network = await sync_to_async(new_session)(), fresh_network()
    claimed = await sync_to_async(socket_caps.claim)(
        "another-process!socket", session=voter_key_for(session.session_key), address=f"{network}.1"
    )
    assert claimed is None
    communicator, kept = await open_socket(session, f"{network}.2")
    assert kept
    assert not (await open_socket(session, f"{network}.3"))[1]
    await communicator.disconnect()
