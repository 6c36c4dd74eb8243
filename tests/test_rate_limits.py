"""Rate limits on battles, messages, votes and every frame (votes/rate_limits.py), on the real cache (Redis)."""

import uuid

import pytest
from django.core.cache import cache
from django.test import override_settings

from votes import rate_limits
from votes.apps import check_rate_limits
from votes.protocol import ArenaError
from votes.rate_limits import DEFAULT_LIMITS, Limit, parse_limits


def fresh(label: str) -> str:
    """A session or address no other test (or earlier run, within the window) has used."""
    return f"{label}-{uuid.uuid4().hex}"


def test_defaults_and_overrides() -> None:
    assert parse_limits("") == DEFAULT_LIMITS
    limits = parse_limits("message=5/10/30, vote=0/0/60")
    assert limits["message"] == Limit(per_session=5, per_network=10, window_s=30)
    assert limits["vote"] == Limit(0, 0, 60)
    assert limits["battle"] == DEFAULT_LIMITS["battle"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chat=1/2/3", "unknown action 'chat'"),
        ("vote=1/2", "is not action=per_session/per_network/window_seconds"),
        ("vote=a/b/c", "is not action=per_session/per_network/window_seconds"),
        ("vote=1/2/0", "a window >= 1 second"),
        ("vote=-1/2/60", "budgets >= 0"),
    ],
)
def test_malformed_limits_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_limits(text)
    with override_settings(ARENA_RATE_LIMITS=text):
        (error,) = check_rate_limits()
    assert error.id == "votes.E001" and message in error.msg


@override_settings(ARENA_RATE_LIMITS="message=3/100/60")
def test_a_session_gets_its_budget_then_a_clear_refusal() -> None:
    session = fresh("session")
    for _ in range(3):
        rate_limits.hit("message", session=session, address=None, now=1_000_000.0)
    with pytest.raises(ArenaError) as refused:
        rate_limits.hit("message", session=session, address=None, now=1_000_010.0)
    assert refused.value.code == "rate_limited"
    assert "Too many messages from this page; try again in" in str(refused.value)
    # Another voter is not affected, and a minute later the earlier messages have slid out.
    rate_limits.hit("message", session=fresh("session"), address=None, now=1_000_010.0)
    rate_limits.hit("message", session=session, address=None, now=1_000_070.0)


@override_settings(ARENA_RATE_LIMITS="message=5/100/60")
def test_a_burst_across_a_window_boundary_does_not_pass_twice_the_budget() -> None:
    """The probe sent 101 messages in about 70 s against 80 a minute: a full budget just before a
    fixed window ended and another just after. The window slides: what was sent just before the
    boundary still counts just after it."""
    session = fresh("session")
    boundary = 60 * 20_000.0
    for _ in range(5):
        rate_limits.hit("message", session=session, address=None, now=boundary - 1)
    with pytest.raises(ArenaError) as refused:
        rate_limits.hit("message", session=session, address=None, now=boundary + 1)
    # Told when one more fits: once enough of the earlier burst has slid out of the last minute.
    wait = int(str(refused.value).split("try again in ")[1].split(" s")[0])
    assert 1 <= wait <= 60
    # Hammering once a second gets nothing more through in the minute after the burst (refused
    # attempts count too, as before).
    for second in range(2, 59):
        with pytest.raises(ArenaError):
            rate_limits.hit("message", session=session, address=None, now=boundary + second)


@override_settings(ARENA_RATE_LIMITS="battle=100/2/3600")
def test_a_network_shares_one_budget_across_its_addresses() -> None:
    """Refused at 10.x.y.9, refused at once at 10.x.y.10 (the same /24), as the message says;
    another network is not."""
    network = f"10.{uuid.uuid4().int % 256}.{uuid.uuid4().int % 256}"
    for host in (7, 8):
        rate_limits.hit("battle", session=fresh("session"), address=f"{network}.{host}", now=4_000_000.0)
    for host in (9, 10):
        with pytest.raises(ArenaError, match="from your network"):
            rate_limits.hit("battle", session=fresh("session"), address=f"{network}.{host}", now=4_000_001.0)
    rate_limits.hit("battle", session=fresh("session"), address="192.0.2.10", now=4_000_001.0)


@override_settings(ARENA_RATE_LIMITS="vote=100/4/60")
def test_an_address_is_shared_by_its_sessions() -> None:
    address = fresh("192.0.2.1")
    for _ in range(4):
        rate_limits.hit("vote", session=fresh("session"), address=address, now=2_000_000.0)
    with pytest.raises(ArenaError, match="from your network"):
        rate_limits.hit("vote", session=fresh("session"), address=address, now=2_000_001.0)


@override_settings(ARENA_RATE_LIMITS="battle=0/0/60")
def test_a_zero_budget_is_no_limit() -> None:
    session, address = fresh("session"), fresh("address")
    for _ in range(50):
        rate_limits.hit("battle", session=session, address=address)


@override_settings(ARENA_RATE_LIMITS="vote=5/5/60")
def test_counters_are_keyed_by_hashes_not_by_sessions_or_addresses() -> None:
    session, address = fresh("session-secret"), "203.0.113.77"
    rate_limits.hit("vote", session=session, address=address, now=3_000_000.0)
    window = int(3_000_000.0 // 60)
    keys = [
        rate_limits.counter_key("vote", kind, value, window)
        for kind, value in (("session", session), ("network", rate_limits.network_of(address)))
    ]
    assert cache.get_many(keys) == dict.fromkeys(keys, 1)
    for key in keys:
        assert session not in key and address not in key
    client = cache._cache.get_client()  # The Redis server itself: what is really stored.
    stored = [key.decode() for key in client.scan_iter(match="*arena:rate:*")]
    assert stored and not any(session in key or address in key for key in stored)


@pytest.mark.django_db(transaction=True)
@override_settings(ARENA_RATE_LIMITS="battle=1/0/3600")
async def test_the_battle_socket_refuses_over_budget(connect_battle, demo_llms) -> None:
    first = await connect_battle()
    await first.send({"type": "start"})
    assert (await first.receive())["type"] == "battle"
    second = await connect_battle()  # Same page session, a second tab.
    await second.send({"type": "start"})
    refused = await second.receive()
    assert refused["type"] == "error" and refused["code"] == "rate_limited", refused


@pytest.mark.django_db(transaction=True)
@override_settings(ARENA_RATE_LIMITS="frame=3/0/60")
async def test_every_frame_type_counts_so_a_sync_flood_is_refused(connect_battle) -> None:
    """A socket flooded with sync frames (15 bytes in, the whole state out) is refused once over
    its budget; so is a malformed frame."""
    client = await connect_battle()
    for _ in range(3):
        await client.send({"type": "sync"})
        assert (await client.receive())["type"] == "state"
    await client.send({"type": "sync"})
    refused = await client.receive()
    assert refused["type"] == "error" and refused["code"] == "rate_limited", refused
    await client.send("not json")
    assert (await client.receive())["code"] == "rate_limited"


@pytest.mark.django_db
def test_new_page_sessions_are_budgeted_per_network(client, settings) -> None:
    """A script fetching the arena page in a loop from one /24 stores at most the budget's
    session rows; past it, 429 with the wait and nothing stored. A page view with its session
    already made costs nothing, and another network still gets one."""
    from django.contrib.sessions.models import Session

    settings.ARENA_NEW_SESSIONS_PER_NETWORK = 3
    network = f"10.{uuid.uuid4().int % 256}.{uuid.uuid4().int % 256}"
    before = Session.objects.count()
    statuses = []
    for host in range(1, 7):
        client.cookies.clear()  # A fresh visitor each time: no cookie kept.
        statuses.append(client.get("/", REMOTE_ADDR=f"{network}.{host}").status_code)
    assert statuses == [200, 200, 200, 429, 429, 429]
    assert Session.objects.count() == before + 3
    refused = client.get("/", REMOTE_ADDR=f"{network}.9")
    assert "Too many new visitors from your network" in refused.content.decode()
    assert int(refused["Retry-After"]) > 0
    client.cookies.clear()
    assert client.get("/", REMOTE_ADDR="192.0.2.44").status_code == 200  # Another network.
    for _ in range(5):  # The same visitor again: its session exists, nothing is counted.
        assert client.get("/", REMOTE_ADDR="192.0.2.44").status_code == 200
    assert Session.objects.count() == before + 4
