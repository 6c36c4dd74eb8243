"""Bad frames get a clear error frame and change nothing in the database."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from tests.conftest import answer_prompt
from votes import services
from votes.models import Battle, Message, Vote

pytestmark = pytest.mark.django_db(transaction=True)


def db_snapshot() -> tuple:
    return (
        list(Battle.objects.values_list("public_id", "state")),
        list(Message.objects.values_list("id", "status", "content")),
        list(Vote.objects.values_list("battle_id", "choice")),
    )


def battle_with_replies(voter_key: str, *, finished: bool) -> Battle:
    battle = services.start_battle(voter_key=voter_key)
    if finished:
        answer_prompt(battle)
    else:
        services.submit_prompt(battle=battle, text="Add a meeting with Fred on Nov 11 at 5PM")
    return battle


async def expect_error(client, frame, code: str) -> dict:
    before = await database_sync_to_async(db_snapshot)()
    await client.send(frame)
    reply = await client.receive(timeout=10)
    assert reply["type"] == "error", reply
    assert reply["code"] == code, reply
    assert reply["message"]
    await client.assert_silent()
    assert await database_sync_to_async(db_snapshot)() == before
    return reply


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("this is not json", "bad_json"),
        ("[1, 2, 3]", "bad_frame"),
        ({"text": "no type"}, "bad_frame"),
        ({"type": "shout", "text": "hi"}, "unknown_type"),
        ({"type": "prompt"}, "bad_frame"),
        ({"type": "prompt", "text": 42}, "bad_frame"),
        ({"type": "prompt", "text": "   "}, "empty_prompt"),
        ({"type": "prompt", "text": "x" * (settings.ARENA_MAX_PROMPT_CHARS + 1)}, "prompt_too_long"),
        ({"type": "prompt", "text": "x" * settings.ARENA_MAX_FRAME_BYTES}, "frame_too_large"),
        ({"type": "vote", "choice": "c"}, "bad_frame"),
        ({"type": "vote", "choice": "a"}, "not_ready"),
        ({"type": "stop", "side": "c"}, "bad_frame"),
        ({"type": "vote", "choice": "a", "stage": "later"}, "bad_frame"),
        ({"type": "prompt", "text": "hi", "side": "both"}, "bad_frame"),
        ({"type": "rate", "side": "a", "turn": 0, "rating": "great"}, "bad_frame"),
        ({"type": "rate", "side": "a", "turn": -1, "rating": "correct"}, "bad_frame"),
        ({"type": "rate", "side": "a", "turn": "0", "rating": "correct"}, "bad_frame"),
        ({"type": "rate", "side": "c", "turn": 0, "rating": "correct"}, "bad_frame"),
        ({"type": "rate", "side": "a", "turn": 0, "rating": "correct"}, "not_ready"),
        ({"type": "regenerate"}, "bad_frame"),
        ({"type": "regenerate", "side": "a"}, "not_ready"),
        ({"type": "end"}, "not_ready"),
        ({"type": "start", "task": 7}, "bad_frame"),
        ({"type": "start", "task": "no-such-task"}, "no_task"),
        ({"type": "prompt", "text": "hi", "side": "a"}, "both_sides_first"),
        # Deep nesting within the size limit: the parser recurses per level.
        ('{"type": "prompt", "text": "hi", "x": ' + "[" * 5000 + "]" * 5000 + "}", "bad_json"),
        # No database can store these as text (PostgreSQL refuses NUL; a lone surrogate has no UTF-8).
        ('{"type": "prompt", "text": "hi \\ud800 there"}', "not_text"),
        ('{"type": "prompt", "text": "hi \\udfff"}', "not_text"),
        ('{"type": "prompt", "text": "hi \\u0000 there"}', "not_text"),
        ('{"type": "start", "task": "calendar\\u0000"}', "bad_frame"),
        ('{"type": "start", "mode": "named", "models": ["a\\ud800", "b"]}', "bad_frame"),
    ],
)
async def test_bad_frames_on_a_new_battle(connect_battle, demo_llms, frame, code) -> None:
    client = await connect_battle()
    await expect_error(client, frame, code)


async def test_a_prompt_after_malformed_ones_starts_the_battle(connect_battle, demo_llms) -> None:
    """Malformed frames cost the socket nothing: no 1011, no empty battle row; the next good
    prompt, with control and bidirectional-override characters that are text, is stored as sent."""
    client = await connect_battle()
    for raw in ('{"type": "prompt", "text": "\\ud83d"}', '{"type": "prompt", "text": ' + "[" * 3000 + "]" * 3000 + "}"):
        await client.send(raw)
        assert (await client.receive(timeout=10))["type"] == "error"
    assert await database_sync_to_async(Battle.objects.count)() == 0
    text = "Add \u202eFred\u202c on Nov 11 \x07\x1b[31m at 5PM \U0001f600"
    await client.send({"type": "prompt", "text": text})
    assert (await client.receive(timeout=10))["type"] == "battle"
    assert (await client.receive(timeout=10)) == {
        "type": "prompt",
        "turn": 0,
        "text": text,
        "sides": ["a", "b"],
        "corrects": [],
    }
    prompts = Message.objects.filter(role=Message.Role.USER).values_list("content", flat=True)
    assert await database_sync_to_async(list)(prompts) == [text, text]


async def test_a_refused_first_prompt_leaves_no_battle(connect_battle, demo_llms, settings) -> None:
    """A free chat's battle is stored with its first prompt: when the prompt is refused (here by
    the turn limit) there is no battle row without messages."""
    settings.ARENA_MAX_TURNS = 0
    client = await connect_battle()
    await expect_error(client, {"type": "prompt", "text": "Add a meeting with Fred"}, "too_many_turns")
    assert await database_sync_to_async(Battle.objects.count)() == 0


async def test_vote_before_both_replies_are_done(connect_battle, demo_llms, voter_session) -> None:
    voter_key = services.voter_key_for(voter_session.session_key)
    battle = await database_sync_to_async(battle_with_replies)(voter_key, finished=False)
    client = await connect_battle(battle.public_id)
    state = await client.receive()
    assert {reply["status"] for reply in state["turns"][0]["replies"].values()} == {"pending"}
    await expect_error(client, {"type": "vote", "choice": "a"}, "not_ready")
    # A prompt while replies are pending is refused too, leaving the pending turn as it is.
    await expect_error(client, {"type": "prompt", "text": "The current year is 2024."}, "busy")


async def test_second_vote_is_refused(connect_battle, demo_llms, voter_session) -> None:
    voter_key = services.voter_key_for(voter_session.session_key)
    battle = await database_sync_to_async(battle_with_replies)(voter_key, finished=True)
    client = await connect_battle(battle.public_id)
    await client.receive()
    await client.send({"type": "vote", "choice": "b"})
    assert (await client.receive())["type"] == "voted"
    await expect_error(client, {"type": "vote", "choice": "a", "stage": "first_try"}, "already_voted")
    # No correction was sent yet: there is nothing to vote on "after the fix".
    await expect_error(client, {"type": "vote", "choice": "a"}, "not_ready")
    await client.send({"type": "end"})
    assert (await client.receive())["type"] == "revealed"
    await expect_error(client, {"type": "vote", "choice": "a"}, "battle_closed")
    await expect_error(client, {"type": "prompt", "text": "One more thing."}, "battle_closed")
    await expect_error(client, {"type": "end"}, "battle_closed")
    vote = await database_sync_to_async(Vote.objects.get)(battle=battle)
    assert vote.choice == "b"


async def test_a_vote_sent_from_two_tabs_at_once_is_stored_once(connect_battle, demo_llms, voter_session) -> None:
    voter_key = services.voter_key_for(voter_session.session_key)
    battle = await database_sync_to_async(battle_with_replies)(voter_key, finished=True)
    tabs = [await connect_battle(battle.public_id) for _ in range(2)]
    for tab in tabs:
        await tab.receive()  # Its state.
    # A double click in each tab, both tabs at the same moment.
    await asyncio.gather(*(tab.send({"type": "vote", "choice": choice}) for tab in tabs for choice in ("a", "a")))
    # Each tab hears of the one stored vote (it is published to the battle) ...
    for tab in tabs:
        await tab.receive_until(lambda f: f["type"] == "voted")
    # ... and the other three frames were refused, each with a clear error: the first-try vote is
    # taken (or, seen after it, the next stage needs a correction first).
    errors = [f for tab in tabs for f in tab.frames if f["type"] == "error"]
    while len(errors) < 3:
        for tab in tabs:
            if not await tab.communicator.receive_nothing(timeout=0.5):
                await tab.receive()
        errors = [f for tab in tabs for f in tab.frames if f["type"] == "error"]
    assert len(errors) == 3 and {f["code"] for f in errors} <= {"already_voted", "not_ready"}
    votes = await database_sync_to_async(list)(Vote.objects.filter(battle=battle))
    assert len(votes) == 1 and votes[0].stage == "first_try" and votes[0].choice == "a"


async def test_unknown_battle_and_missing_session(connect_battle, demo_llms) -> None:
    client = await connect_battle("does-not-exist")
    frame = await client.receive(timeout=10)
    assert frame["code"] == "not_found"

    from channels.testing import WebsocketCommunicator

    from arena_site.asgi import application

    page = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    anonymous = WebsocketCommunicator(application, "/ws/battle/", headers=page)
    connected, _ = await anonymous.connect(timeout=10)
    assert connected
    assert json.loads(await anonymous.receive_from(timeout=10))["code"] == "no_session"
    await anonymous.disconnect()


def test_database_refuses_a_second_vote_row(db, demo_llms) -> None:
    from django.db import IntegrityError, transaction

    battle = battle_with_replies("voter", finished=True)
    Vote.objects.create(battle=battle, choice="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Vote.objects.create(battle=battle, choice="b")


async def test_a_socket_from_another_origin_is_refused(voter_session) -> None:
    """Cross-site websocket hijacking: a page on another site cannot open the voter's battle socket."""
    from channels.testing import WebsocketCommunicator

    from arena_site.asgi import application

    headers = [
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={voter_session.session_key}".encode()),
        (b"origin", b"http://evil.example"),
        (b"host", b"127.0.0.1"),
    ]
    foreign = WebsocketCommunicator(application, "/ws/battle/", headers=headers)
    connected, _ = await foreign.connect(timeout=10)
    assert not connected
    # The same host on another port (another origin, another server) is refused too.
    headers[1:] = [(b"origin", b"http://127.0.0.1:8001"), (b"host", b"127.0.0.1:8000")]
    other_port = WebsocketCommunicator(application, "/ws/battle/", headers=headers)
    connected, _ = await other_port.connect(timeout=10)
    assert not connected


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", True),
        ("http://127.0.0.1", "127.0.0.1:80", "ws", True),  # The scheme's default port, written or not.
        ("https://localhost", "localhost", "wss", True),
        ("http://127.0.0.1:8001", "127.0.0.1:8000", "ws", False),  # Another port.
        ("https://127.0.0.1:8000", "127.0.0.1:8000", "ws", False),  # Another scheme.
        ("http://127.0.0.1", "127.0.0.1", "wss", False),
        ("http://evil.example", "evil.example", "ws", False),  # Its own origin, but not an allowed host.
        ("http://127.0.0.1:99999", "127.0.0.1:99999", "ws", False),  # Not a port.
        ("null", "127.0.0.1", "ws", False),
        (None, "127.0.0.1", "ws", False),
        ("http://127.0.0.1", None, "ws", False),
        ("https://arena.example.org", "web:8000", "ws", True),  # Listed in CSRF_TRUSTED_ORIGINS.
        ("https://arena.example.org:8443", "web:8000", "ws", False),  # Listed without that port.
        ("http://arena.example.org", "web:8000", "ws", False),  # Nor that scheme.
    ],
)
def test_only_the_sites_own_origin_may_open_the_socket(
    settings, origin: str | None, host: str | None, scheme: str, allowed: bool
) -> None:
    from arena_site.origins import same_origin_allowed

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://arena.example.org"]
    assert same_origin_allowed(origin, host, scheme) is allowed
