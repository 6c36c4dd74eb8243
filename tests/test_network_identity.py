"""Voter identity an attacker cannot reset (issue 17 point 3, in part): the network key
(arena_site/networks.py), stored on each battle from the socket's client address, and the
anomaly detection's tests applied to votes grouped by network, which catch a campaign that
starts every battle in a fresh session."""

import numpy as np
import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from arena_site.asgi import application
from arena_site.networks import client_network, network_key
from leaderboard import ratings
from leaderboard.anomaly import pair_vote, suspicious_voters
from tests.conftest import BattleClient, close_query_thread_connections, cookie_headers
from votes import services
from votes.models import Battle

SECRET = b"test-secret"


@pytest.mark.parametrize(
    ("address", "network"),
    [
        ("198.51.100.7", "198.51.100.0/24"),
        ("198.51.100.250", "198.51.100.0/24"),
        ("::ffff:198.51.100.9", "198.51.100.0/24"),  # IPv4-mapped: the IPv4 network.
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("testclient", None),
        ("", None),
    ],
)
def test_client_network(address: str, network: str | None) -> None:
    assert client_network(address) == network


def test_network_key_is_a_keyed_hash_of_the_network_not_of_the_address() -> None:
    key = network_key("198.51.100.7", SECRET)
    assert key == network_key("198.51.100.200", SECRET) == network_key("::ffff:198.51.100.1", SECRET)
    assert key != network_key("198.51.101.7", SECRET)
    assert key != network_key("198.51.100.7", b"another secret")  # Keyed: not guessable without it.
    assert "198.51" not in key and len(key) == 64
    assert network_key("2001:db8::1", SECRET) == network_key("2001:db8::ffff:1", SECRET)
    assert network_key("2001:db8::1", SECRET) != network_key("2001:db8:0:1::1", SECRET)
    assert network_key(None, SECRET) == network_key("unknown", SECRET) == ""


# The simulation: the probe's campaign against an arena of honest voters with a known truth.

HONEST_NETWORKS = 40  # Honest voters share these (offices, NATs, carriers): about 250 votes each.
CAMPAIGN_NETWORKS = ("campaign-net-1", "campaign-net-2")


def campaign_arena(seed: int, models: int = 20, honest: int = 1000, per_voter: int = 10):
    """Rows (voter key, network key, model A, model B, choice): ``honest`` voters spread over
    ``HONEST_NETWORKS`` shared networks (Bradley-Terry outcomes from ratings N(1000, 100), 10%
    ties, random pairs), and a campaign casting 5% of all votes for the weakest model, each vote
    in a fresh session (its own voter key) from one of two addresses."""
    rng = np.random.default_rng(seed)
    names = [f"model-{i:02d}" for i in range(models)]
    true = rng.normal(1000.0, 100.0, models)
    target = int(np.argmin(true))
    rows = []
    for voter in range(honest):
        network = f"honest-net-{rng.integers(HONEST_NETWORKS)}"
        for _ in range(per_voter):
            a, b = rng.choice(models, 2, replace=False)
            p_a = 1.0 / (1.0 + 10.0 ** ((true[b] - true[a]) / 400.0))
            choice = "tie" if rng.random() < 0.1 else ("a" if rng.random() < p_a else "b")
            rows.append((f"honest-{voter}", network, names[a], names[b], choice))
    campaign = round(0.05 * len(rows) / 0.95)
    for vote in range(campaign):
        opponent = int(rng.choice([m for m in range(models) if m != target]))
        sides = (target, opponent) if rng.random() < 0.5 else (opponent, target)
        choice = "a" if sides[0] == target else "b"
        rows.append((f"fresh-session-{vote}", CAMPAIGN_NETWORKS[vote % 2], names[sides[0]], names[sides[1]], choice))
    return names, target, rows


def flagged_groups(rows: list, column: int) -> set[str]:
    """What the detection (the refresh's tests, their defaults) flags, grouping the votes by
    voter key (column 0) or by network key (column 1)."""
    return {a.voter for a in suspicious_voters([pair_vote(row[column], *row[2:]) for row in rows])}


def board_of(names: list[str], rows: list) -> ratings.RatingsWithIntervals:
    index = {name: i for i, name in enumerate(names)}
    games = [(index[a], index[b], ratings.VOTE_SCORES[choice]) for *_, a, b, choice in rows]
    return ratings.sandwich_intervals(ratings.PairOutcomes.from_games(len(names), games))


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_fresh_session_campaign_is_caught_by_its_network_and_its_gain_undone(seed: int) -> None:
    """(a) by voter key alone nothing is flagged: each fresh session has one vote, below the
    detection's minimum; (b) by network, both campaign networks are flagged and no honest one;
    (c) once the flagged networks' votes are left out, the target's rating differs from the
    honest-only board's by less than its interval's half-width (the attack moved it by more
    than twice that)."""
    names, target, rows = campaign_arena(seed)
    assert flagged_groups(rows, 0) == set()  # (a) The break: fresh sessions hide the campaign.
    flagged = flagged_groups(rows, 1)
    assert flagged == set(CAMPAIGN_NETWORKS)  # (b)
    honest_only = board_of(names, [row for row in rows if row[0].startswith("honest")])
    attacked = board_of(names, rows)
    cleaned = board_of(names, [row for row in rows if row[1] not in flagged])
    half_width = (cleaned.upper[target] - cleaned.lower[target]) / 2.0
    assert attacked.ratings[target] - honest_only.ratings[target] > 2 * half_width  # The attack worked...
    assert abs(cleaned.ratings[target] - honest_only.ratings[target]) <= half_width  # ...and is undone (c).


def test_honest_voters_sharing_a_few_busy_networks_are_not_flagged() -> None:
    """False positives: 1000 honest voters behind only 5 networks (200 voters, 2000 votes each:
    big offices or carrier NATs), and behind 40. Over 20 seeds, no honest network is flagged in
    at least 18 of them at the detection's default alpha."""
    clean = 0
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        models, true = 12, rng.normal(1000.0, 100.0, 12)
        rows = []
        for voter in range(1000):
            network = f"net-{voter % (5 if seed % 2 else 40)}"
            for _ in range(10):
                a, b = rng.choice(models, 2, replace=False)
                p_a = 1.0 / (1.0 + 10.0 ** ((true[b] - true[a]) / 400.0))
                choice = "tie" if rng.random() < 0.1 else ("a" if rng.random() < p_a else "b")
                rows.append((f"voter-{voter}", network, f"m{a}", f"m{b}", choice))
        clean += not flagged_groups(rows, 1)
    assert clean >= 18, clean


# The real consumer: the battle keeps its network's key, never the address.


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_stores_the_network_key_of_the_client_address(voter_session, demo_llms) -> None:
    communicators = []
    try:
        for address in ("203.0.113.45", "2001:db8:5:6::77"):
            communicator = WebsocketCommunicator(application, "/ws/battle/", headers=cookie_headers(voter_session))
            communicator.scope["client"] = (address, 40000)
            connected, _ = await communicator.connect(timeout=10)
            assert connected
            communicators.append(communicator)
            client = BattleClient(communicator)
            await client.send({"type": "start", "task": None})
            frame = await client.receive_until(lambda f: f["type"] == "battle")
            battle = await database_sync_to_async(Battle.objects.get)(public_id=frame[-1]["battle"])
            assert battle.network_key == services.network_key_for(address) != ""
            assert battle.network_key == services.network_key_for(address.replace("45", "99").replace("77", "1"))
            row = await database_sync_to_async(lambda pk: list(Battle.objects.filter(pk=pk).values().get().values()))(
                battle.pk
            )
            assert not any(isinstance(value, str) and address in value for value in row)
    finally:
        for communicator in communicators:
            await communicator.disconnect()
        await sync_to_async(connections.close_all)()
        await sync_to_async(close_query_thread_connections)()
