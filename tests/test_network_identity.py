"""Voter identity an attacker cannot reset (issue 17 point 3, in part): the network key
(arena_site/networks.py), stored on each battle from the socket's client address, and the
anomaly detection's tests applied to votes grouped by network, which catch a campaign that
starts every battle in a fresh session."""

import random

import numpy as np
import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.db import connections

from arena_site.networks import client_network, network_key
from inference.models import LLM
from leaderboard import selectors
from leaderboard import services as leaderboard_services
from leaderboard.anomaly import VoteTable, campaign_voters, pair_vote, suspicious_voters
from tests.conftest import BattleClient, answer_prompt, close_query_thread_connections, open_battle_socket
from tests.simulated_voters import MEDIUM, STRONG, WEAK, board_of, bradley_terry_votes, honest_votes, store_votes
from votes import services
from votes.models import Battle, FlaggedNetwork, FlaggedVoter, FlagSource, Vote

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
    rows = bradley_terry_votes(
        rng,
        true,
        names,
        voters=honest,
        per_voter=per_voter,
        network=lambda _: f"honest-net-{rng.integers(HONEST_NETWORKS)}",
    )
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


def network_flags(rows: list) -> tuple[set[str], set[str]]:
    """What a refresh flags through networks: the flagged networks, and the voters behind them
    whose votes there are the campaign's (anomaly.campaign_voters, against the voters' table)."""
    networks = flagged_groups(rows, 1)
    voters = VoteTable.from_votes([pair_vote(row[0], *row[2:]) for row in rows])
    behind = [(network, voter, a, b, choice, 1) for voter, network, a, b, choice in rows if network in networks]
    return networks, set(campaign_voters(behind, voters))


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_fresh_session_campaign_is_caught_by_its_network_and_its_gain_undone(seed: int) -> None:
    """(a) by voter key alone nothing is flagged: each fresh session has one vote, below the
    detection's minimum; (b) by network, both campaign networks are flagged and no honest one;
    (c) every session of the campaign is flagged behind them, and once their votes are left
    out, the target's rating differs from the honest-only board's by less than its interval's
    half-width (the attack moved it by more than twice that)."""
    names, target, rows = campaign_arena(seed)
    assert flagged_groups(rows, 0) == set()  # (a) The break: fresh sessions hide the campaign.
    flagged, voters = network_flags(rows)
    assert flagged == set(CAMPAIGN_NETWORKS)  # (b)
    assert voters == {row[0] for row in rows if row[1] in flagged}  # (c)
    honest_only = board_of(names, [row for row in rows if row[0].startswith("honest")])
    attacked = board_of(names, rows)
    cleaned = board_of(names, [row for row in rows if row[0] not in voters])
    half_width = (cleaned.upper[target] - cleaned.lower[target]) / 2.0
    assert attacked.ratings[target] - honest_only.ratings[target] > 2 * half_width  # The attack worked...
    assert abs(cleaned.ratings[target] - honest_only.ratings[target]) <= half_width  # ...and is undone (c).


NATS = ("nat-1", "nat-2", "nat-3")


@pytest.mark.parametrize("seed", [24, 25])
def test_a_campaign_through_shared_networks_takes_out_its_votes_not_their_honest_voters(seed: int) -> None:
    """Three large NATs carry 100 honest voters each (the other 700 spread over 40 networks)
    and a campaign of fresh sessions, one vote each for the weakest model, 5% of all votes: the
    three are flagged, and behind them every campaign session and at most 1% of the 300 honest
    voters (their votes stay on the board); once the flagged voters' votes are left out, the
    target's rating is within its interval's half-width of the honest-only board's."""
    rng = np.random.default_rng(seed)
    names = [f"model-{i:02d}" for i in range(20)]
    true = rng.normal(1000.0, 100.0, 20)
    target = int(np.argmin(true))
    rows = bradley_terry_votes(
        rng,
        true,
        names,
        voters=1000,
        per_voter=10,
        network=lambda voter: NATS[voter % 3] if voter < 300 else f"honest-net-{voter % 40}",
    )
    for vote in range(round(0.05 * len(rows) / 0.95)):
        opponent = int(rng.choice([m for m in range(20) if m != target]))
        sides = (target, opponent) if rng.random() < 0.5 else (opponent, target)
        choice = "a" if sides[0] == target else "b"
        rows.append((f"fresh-session-{vote}", NATS[vote % 3], names[sides[0]], names[sides[1]], choice))
    flagged, voters = network_flags(rows)
    assert flagged == set(NATS)
    campaign = {row[0] for row in rows if row[0].startswith("fresh")}
    behind = {row[0] for row in rows if row[1] in NATS and row[0].startswith("honest")}
    assert len(behind) == 300
    assert campaign <= voters
    print(f"seed {seed}: {len(voters & behind)} of the 300 honest voters behind the NATs flagged with them")
    assert len(voters & behind) <= 3, len(voters & behind)
    honest_only = board_of(names, [row for row in rows if row[0].startswith("honest")])
    cleaned = board_of(names, [row for row in rows if row[0] not in voters])
    half_width = (cleaned.upper[target] - cleaned.lower[target]) / 2.0
    assert abs(cleaned.ratings[target] - honest_only.ratings[target]) <= half_width


def test_honest_voters_sharing_a_few_busy_networks_are_not_flagged() -> None:
    """False positives: 1000 honest voters behind only 5 networks (200 voters, 2000 votes each:
    big offices or carrier NATs), and behind 40. Over 20 seeds, no honest network is flagged in
    at least 18 of them at the detection's default alpha."""
    clean = 0
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        true = rng.normal(1000.0, 100.0, 12)
        networks = 5 if seed % 2 else 40
        names = [f"m{i}" for i in range(12)]
        rows = bradley_terry_votes(
            rng,
            true,
            names,
            voters=1000,
            per_voter=10,
            network=lambda voter, networks=networks: f"net-{voter % networks}",
        )
        clean += not flagged_groups(rows, 1)
    assert clean >= 18, clean


# The real consumer: the battle keeps its network's key, never the address.


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_stores_the_network_key_of_the_client_address(voter_session, demo_llms) -> None:
    communicators = []
    try:
        for address in ("203.0.113.45", "2001:db8:5:6::77"):
            communicator = await open_battle_socket(voter_session, address=address)
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


# A scripted campaign against the real consumer, caught by the refresh as production runs it.

CAMPAIGN_ADDRESSES = ("192.0.2.10", "2001:db8:77::10")
CAMPAIGN_VOTES_PER_ADDRESS = 10


def honest_history(models: dict[str, LLM]) -> int:
    """300 honest voters on 12 shared networks (4 votes each: the strong model beats the weak
    one 90% of the time and the medium one 60%), stored as ended battles; their vote count."""
    rows = honest_votes(
        random.Random(5),
        voters=300,
        per_voter=4,
        network=lambda voter: services.network_key_for(f"198.51.{voter % 12}.{voter % 200 + 1}"),
    )
    store_votes(rows, models)
    return len(rows)


async def campaign_battle(address: str, session: SessionStore | None = None, vote_for: str | None = WEAK) -> bool:
    """One battle of the campaign: a fresh session (or ``session``) from ``address`` through the
    real consumer, a vote for ``vote_for`` when it was drawn (else the battle is left; None: a
    vote for side A), and the end. Whether it voted."""
    communicator = await open_battle_socket(session, address=address)
    try:
        client = BattleClient(communicator)
        await client.send({"type": "start", "task": None})
        frames = await client.receive_until(lambda f: f["type"] == "battle")
        battle = await database_sync_to_async(Battle.objects.select_related("model_a", "model_b").get)(
            public_id=frames[-1]["battle"]
        )
        if vote_for is not None and vote_for not in (battle.model_a.name, battle.model_b.name):
            return False
        await database_sync_to_async(answer_prompt)(battle)
        choice = "b" if vote_for is not None and battle.model_b.name == vote_for else "a"
        await client.send({"type": "vote", "choice": choice})
        voted = await client.receive_until(lambda f: f["type"] in ("voted", "error"))
        assert voted[-1] == {"type": "voted", "stage": "first_try", "choice": choice, "after_turn": 0}
        await client.send({"type": "end"})
        await client.receive_until(lambda f: f["type"] == "revealed")
        return True
    finally:
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_fresh_session_campaign_through_the_consumer_is_flagged_by_network(client) -> None:
    """Twenty battles, each in a fresh session, from two addresses (one IPv4, one IPv6), each
    voting for the weak model: no voter key has enough votes to judge, but the refresh flags
    both networks, flags every one of their sessions that voted (for the networks' target) and
    leaves all 20 votes out of the board;
    no honest network or voter is flagged. Clearing a network in the admin puts its votes back."""
    models = await database_sync_to_async(
        lambda: {
            name: LLM.objects.create(name=name, family="gemma", preset=name, queue=f"q.{name}", context_tokens=2048)
            for name in (STRONG, WEAK, MEDIUM)
        }
    )()
    honest = await database_sync_to_async(honest_history)(models)
    try:
        for address in CAMPAIGN_ADDRESSES:
            voted = 0
            while voted < CAMPAIGN_VOTES_PER_ADDRESS:
                voted += await campaign_battle(address)
    finally:
        await sync_to_async(connections.close_all)()
        await sync_to_async(close_query_thread_connections)()
    await database_sync_to_async(check_the_refresh)(client, honest)


def check_the_refresh(client, honest: int) -> None:
    campaign = 2 * CAMPAIGN_VOTES_PER_ADDRESS
    campaign_networks = {services.network_key_for(address) for address in CAMPAIGN_ADDRESSES}
    leaderboard_services.refresh_leaderboard(rounds=20)  # As beat's task runs it.
    assert set(FlaggedNetwork.objects.values_list("network_key", flat=True)) == campaign_networks
    flag = FlaggedNetwork.objects.first()
    assert flag.source == FlagSource.AUTOMATIC and flag.p_value < 1e-4 and flag.reason.startswith("network: ")
    # Every session that voted from them (the others, which left their battle, have no vote).
    campaign_voters = set(
        Vote.objects.filter(battle__network_key__in=campaign_networks).values_list("battle__voter_key", flat=True)
    )
    assert len(campaign_voters) == campaign
    assert set(FlaggedVoter.objects.values_list("voter_key", flat=True)) == campaign_voters  # No honest one.
    assert FlaggedVoter.objects.filter(network__isnull=True).count() == 0  # None flagged alone: one vote each.
    assert selectors.excluded_votes()["flagged voter"] == campaign
    assert selectors.counted_votes().count() == honest
    # The board the refresh stored leaves them out too.
    overall = leaderboard_selectors_latest_overall()
    assert overall.excluded["flagged voter"] == campaign and overall.votes == honest

    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "a-long-password-9")
    client.force_login(admin)
    response = client.post(
        "/admin/votes/flaggednetwork/",
        {"action": "clear_flags", "_selected_action": list(FlaggedNetwork.objects.values_list("pk", flat=True))},
        follow=True,
    )
    assert response.status_code == 200
    assert selectors.excluded_votes()["flagged voter"] == 0
    leaderboard_services.refresh_leaderboard(rounds=20)  # Cleared: not flagged again.
    assert not FlaggedNetwork.objects.filter(cleared=False).exists()
    assert not FlaggedVoter.objects.filter(cleared=False).exists()
    assert selectors.counted_votes().count() == honest + campaign


@pytest.mark.django_db
def test_a_network_flag_keeps_the_honest_votes_behind_it() -> None:
    """A busy network carries 100 honest voters (4 votes each) and 20 one-vote sessions for the
    weak model; it is flagged, and one of its honest voters carries a flag pointing at it (as
    every voter behind a flagged network once did). The refresh flags the 20 sessions, removes
    that honest voter's flag and counts every honest vote."""
    models = {
        name: LLM.objects.create(name=name, family="gemma", preset=name, queue=f"q.{name}", context_tokens=2048)
        for name in (STRONG, WEAK, MEDIUM)
    }
    busy = services.network_key_for("203.0.113.9")
    rows = honest_votes(random.Random(6), voters=300, per_voter=4, network=lambda voter: busy if voter < 100 else "")
    rows += [(f"session-{i}", busy, WEAK, STRONG, "a") for i in range(20)]
    store_votes(rows, models)
    network = FlaggedNetwork.objects.create(network_key=busy, reason="network: test", source=FlagSource.AUTOMATIC)
    FlaggedVoter.objects.create(voter_key="honest-3", network=network, reason="voted from a flagged network")
    leaderboard_services.refresh_leaderboard(rounds=20)
    flagged = set(FlaggedVoter.objects.filter(cleared=False).values_list("voter_key", flat=True))
    assert flagged == {f"session-{i}" for i in range(20)}
    assert selectors.counted_votes().count() == len(rows) - 20


def leaderboard_selectors_latest_overall():
    return selectors.latest_refresh().snapshots.get(category=selectors.OVERALL)


@pytest.mark.django_db(transaction=True)
async def test_votes_past_the_daily_caps_are_kept_but_left_off_the_board(settings) -> None:
    """Caps of 2 votes a voter and 3 a network a day: one session casts 3 votes (the third is
    past its voter's cap), a second session on the same /24 casts 2 (the second is past the
    network's cap), a session on another network 1. Every vote is stored and answered alike
    ("voted"); the board counts 4 and leaves 2 out as "over daily cap"."""
    settings.ARENA_VOTES_PER_VOTER_PER_DAY = 2
    settings.ARENA_VOTES_PER_NETWORK_PER_DAY = 3
    await database_sync_to_async(
        lambda: [
            LLM.objects.create(name=name, family="gemma", preset=name, queue=f"q.{name}", context_tokens=2048)
            for name in (STRONG, WEAK)
        ]
    )()
    sessions = []
    for _ in range(3):
        session = SessionStore()
        await sync_to_async(session.create)()
        sessions.append(session)
    try:
        for session, address, battles in (
            (sessions[0], "192.0.2.1", 3),
            (sessions[1], "192.0.2.99", 2),
            (sessions[2], "198.51.100.1", 1),
        ):
            for _ in range(battles):
                assert await campaign_battle(address, session, vote_for=None)
    finally:
        await sync_to_async(connections.close_all)()
        await sync_to_async(close_query_thread_connections)()
    await database_sync_to_async(check_the_caps)()


def check_the_caps() -> None:
    over = list(Vote.objects.order_by("pk").values_list("over_daily_cap", flat=True))
    assert over == [False, False, True, False, True, False]
    leaderboard_services.refresh_leaderboard(rounds=20)
    overall = leaderboard_selectors_latest_overall()
    assert overall.votes == 4 and overall.excluded["over daily cap"] == 2
    assert selectors.counted_votes().count() == 4
    assert not FlaggedVoter.objects.exists()
