"""The client address cannot be forged: X-Forwarded-For is read only from a trusted proxy
(``TRUSTED_PROXIES``), and then the client is its right-most untrusted hop
(``arena_site.asgi.build_application``). Checked through the site's own ASGI application: the
research API's per-address throttle for HTTP, the battle socket's rate-limit address for
websockets."""

import json
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest
from channels.testing import HttpCommunicator
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import ImproperlyConfigured

from arena_site.asgi import build_application
from tests.conftest import open_battle_socket
from votes import rate_limits
from votes.protocol import ArenaError

pytestmark = pytest.mark.django_db(transaction=True)


_networks_used: set[int] = set()


def fresh_address() -> str:
    """An address in a /24 network no other call has used: the throttles count per network
    (``votes.rate_limits.network_of``), so two addresses of one /24 would share a budget. Drawn
    from 198.18.0.0/15 (512 networks), so an earlier run within the throttle's minute is unlikely
    to have used it either (conftest clears the throttles between tests anyway)."""
    network = secrets.randbelow(512)
    while network in _networks_used:
        network = secrets.randbelow(512)
    _networks_used.add(network)
    return f"198.{18 + network // 256}.{network % 256}.{secrets.randbelow(254) + 1}"


async def api_status(application: Any, peer: str, forwarded_for: str | None) -> int:
    headers = [(b"host", b"127.0.0.1")]
    if forwarded_for is not None:
        headers.append((b"x-forwarded-for", forwarded_for.encode()))
    communicator = HttpCommunicator(application, "GET", "/api/v1/models", headers=headers)
    communicator.scope["client"] = (peer, 40000)
    response = await communicator.get_response(timeout=10)
    return int(response["status"])


async def test_a_forged_header_from_an_untrusted_peer_changes_nothing(settings: Any) -> None:
    settings.ARENA_API_ANON_PER_MINUTE = 1
    application = build_application([])  # The default: no proxy is trusted.
    peer = fresh_address()
    assert await api_status(application, peer, fresh_address()) == 200
    # Another forged client each time: still the peer's budget, which is spent.
    assert await api_status(application, peer, fresh_address()) == 429
    assert await api_status(application, peer, None) == 429


async def test_through_a_trusted_proxy_the_client_address_counts(settings: Any) -> None:
    settings.ARENA_API_ANON_PER_MINUTE = 1
    proxy = fresh_address()
    application = build_application([f"{proxy}", "10.0.0.0/8"])
    first, second = fresh_address(), fresh_address()
    assert await api_status(application, proxy, first) == 200
    assert await api_status(application, proxy, second) == 200  # Another client: its own budget.
    assert await api_status(application, proxy, first) == 429
    # The right-most hop that is not a trusted proxy: a hop the client wrote on the left is
    # ignored, and a second trusted proxy (10.0.0.7) on the right is skipped.
    third = fresh_address()
    assert await api_status(application, proxy, f"{first}, {third}, 10.0.0.7") == 200
    assert await api_status(application, proxy, f"{fresh_address()}, {third}") == 429


async def test_the_battle_socket_counts_the_forwarded_address_only_from_a_trusted_proxy(
    voter_session: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str | None] = []

    def refuse(action: str, *, session: str, address: str | None, now: float | None = None) -> None:
        counted.append(address)
        raise ArenaError("rate_limited", "Counted.")

    monkeypatch.setattr(rate_limits, "hit", refuse)
    proxy, client = fresh_address(), fresh_address()
    for trusted, expected in (([], proxy), ([proxy], client)):
        communicator = await open_battle_socket(
            voter_session,
            address=proxy,
            application=build_application(trusted),
            extra_headers=[(b"x-forwarded-for", client.encode())],
        )
        await communicator.send_to(text_data=json.dumps({"type": "prompt", "text": "Hi"}))
        frame = json.loads(await communicator.receive_from(timeout=10))
        assert frame["type"] == "error" and frame["code"] == "rate_limited", frame
        assert counted[-1] == expected
        await communicator.disconnect()


def test_a_trusted_proxy_that_is_not_an_address_is_refused_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "arena_site.settings", "TRUSTED_PROXIES": "10.0.0.0/8,x.example"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert ImproperlyConfigured.__name__ in result.stderr and "'x.example'" in result.stderr
