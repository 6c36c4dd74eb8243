"""PostgreSQL unavailable: a clear 503 page (JSON on the API), error frames on the websocket, and
nothing half-written. The outage is real: the connection goes to a port where no server listens,
or the server ends the session in the middle of a transaction."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError, connection, connections
from django.test import Client
from django.utils.html import escape

from arena_site.unavailable import MESSAGE
from votes import consumers, services
from votes.consumers import DATABASE_UNAVAILABLE, TRY_AGAIN_LATER
from votes.models import Battle, Message, Vote
from votes.testing.stack import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def database_down(*, close: bool = True) -> Iterator[None]:
    """Every new connection of every thread goes to a closed port until the block ends.

    Async tests pass ``close=False`` (closing is sync-only) and close the connection of the
    websocket's database thread with ``close_consumer_connections``.
    """
    # The settings new connections (in any thread) are made from, and this thread's.
    configured = {id(d): d for d in (connections.settings["default"], connection.settings_dict)}.values()
    real_port = connection.settings_dict["PORT"]
    try:
        for settings_dict in configured:
            settings_dict["PORT"] = str(free_port())
        if close:
            connections.close_all()
        yield
    finally:
        for settings_dict in configured:
            settings_dict["PORT"] = real_port
        if close:
            connections.close_all()


async def close_consumer_connections() -> None:
    """The sockets' queries get a fresh pool, whose threads open new connections (the old
    threads' open connections would still reach the real server)."""
    consumers.query_threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="arena-query-test")


def test_pages_and_api_answer_503_with_a_clear_message(demo_llms) -> None:
    client = Client(raise_request_exception=False)
    with database_down():
        for path in ["/", "/leaderboard/", "/healthz"]:
            response = client.get(path)
            assert response.status_code == 503, path
            assert response["Retry-After"] == "30"
            assert escape(MESSAGE) in response.content.decode()
            assert "Traceback" not in response.content.decode()
        api = client.get("/api/v1/models")
        assert api.status_code == 503
        assert api.json() == {"detail": MESSAGE}
    assert client.get("/").status_code == 200  # back as soon as the database is


async def test_websocket_frames_get_an_error_frame_and_the_socket_stays(connect_battle, demo_llms) -> None:
    client = await connect_battle()
    await client.send({"type": "start"})
    public_id = (await client.receive())["battle"]
    await client.receive_until(lambda f: f["type"] == "state")

    with database_down(close=False):
        await close_consumer_connections()
        await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
        error = await client.receive()
        assert error == {"type": "error", "code": "unavailable", "message": DATABASE_UNAVAILABLE.message}
        # A page reconnecting meanwhile is told so and asked to come back later (it retries).
        other = await connect_battle(public_id)
        assert (await other.receive())["code"] == "unavailable"
        closed = await other.communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": TRY_AGAIN_LATER}

    # Nothing of the refused prompt was written; once the database is back the same socket works.
    assert await database_sync_to_async(Message.objects.filter(battle__public_id=public_id).count)() == 0
    await client.send({"type": "sync"})
    state = await client.receive()
    assert (state["type"], state["battle"], state["turns"]) == ("state", public_id, [])


def test_a_prompt_cut_off_mid_transaction_writes_nothing(demo_llms) -> None:
    battle = Battle.objects.create(model_a=demo_llms[0], model_b=demo_llms[1], voter_key="x")
    Message.objects.create(battle=battle, side="a", turn=0, role="user", content="First")
    Message.objects.create(battle=battle, side="b", turn=0, role="user", content="First")
    Message.objects.create(battle=battle, side="a", turn=0, role="assistant", content="One")
    Message.objects.create(battle=battle, side="b", turn=0, role="assistant", content="Two")
    Vote.objects.create(battle=battle, stage="first_try", choice="a", after_turn=0)
    inserts = 0

    def cut_off_after_first_insert(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        nonlocal inserts
        if sql.startswith('INSERT INTO "votes_message"'):
            inserts += 1
            if inserts == 2:  # the server ends this session between two writes of one prompt
                with psycopg.connect(conninfo(), autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
        return execute(sql, params, many, context)

    with pytest.raises(OperationalError), connection.execute_wrapper(cut_off_after_first_insert):
        services.submit_prompt(battle=battle, text="It is at 6PM.")
    connection.close()

    assert inserts == 2
    assert list(Message.objects.filter(battle=battle, turn=1)) == []
    assert Message.objects.filter(battle=battle).count() == 4
    assert Vote.objects.filter(battle=battle).count() == 1
    # Once the database is reachable again, the same prompt goes through whole.
    submitted = services.submit_prompt(battle=battle, text="It is at 6PM.")
    assert Message.objects.filter(battle=battle, turn=1).count() == 2 * len(submitted.jobs)


def conninfo() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER']} dbname={s['NAME']}"


async def test_unreachable_database_does_not_break_a_later_connection(connect_battle, demo_llms) -> None:
    with database_down(close=False):
        await close_consumer_connections()
        client = await connect_battle()
        await client.send({"type": "start"})
        assert (await client.receive())["code"] == "unavailable"
    await close_consumer_connections()
    await client.send({"type": "start"})
    assert (await client.receive())["type"] == "battle"
