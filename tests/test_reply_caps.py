"""Generation is fair between networks: one network has at most ARENA_REPLIES_PER_NETWORK replies
queued or streaming (votes/reply_caps.py), so a flood from it cannot fill the workers' queues
ahead of another voter. Real sockets, PostgreSQL and Redis; no worker runs, so every reply
stays queued, as behind a busy worker."""

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from tests.conftest import close_query_thread_connections, fresh_network, open_battle_socket
from votes import reply_caps
from votes.models import Battle, Message
from votes.protocol import ArenaError

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = {"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"}


async def first_frame_after_prompt(communicator: WebsocketCommunicator) -> dict[str, Any]:
    """The first frame answering a first prompt: ``battle`` when accepted, ``error`` when not."""
    await communicator.send_to(text_data=json.dumps(PROMPT))
    return json.loads(await communicator.receive_from(timeout=10))


async def test_one_networks_flood_cannot_queue_ahead_of_another_voter(settings: Any, unserved_llms: Any) -> None:
    settings.ARENA_REPLIES_PER_NETWORK = 4
    network_a, network_b = fresh_network(), fresh_network()
    pages = [await open_battle_socket(address=f"{network_a}.{host}") for host in range(1, 4)]
    # Two battles: four replies queued for network A, its cap.
    for communicator in pages[:2]:
        assert (await first_frame_after_prompt(communicator))["type"] == "battle"
        # Its replies are counted by the time the prompt is published to the battle's pages.
        assert json.loads(await communicator.receive_from(timeout=10))["type"] == "prompt"
    # A third, within every rate budget and from another address of A's /24, is refused before
    # anything is stored: no battle, no reply queued.
    battles_before = await database_sync_to_async(Battle.objects.count)()
    refused = await first_frame_after_prompt(pages[2])
    assert refused["type"] == "error" and refused["code"] == "busy", refused
    assert "wait for one to finish" in refused["message"]
    assert await database_sync_to_async(Battle.objects.count)() == battles_before
    # Voter B, on another network, is queued at once: behind none of A's backlog beyond its cap.
    voter_b = await open_battle_socket(address=f"{network_b}.1")
    assert (await first_frame_after_prompt(voter_b))["type"] == "battle"
    # One of A's replies finishes (as a worker would end it): A has room for... one reply, not two.
    await database_sync_to_async(
        lambda: (
            Message.objects.filter(role=Message.Role.ASSISTANT, status=Message.Status.PENDING)
            .filter(id=Message.objects.filter(role=Message.Role.ASSISTANT).order_by("id").first().id)
            .update(status=Message.Status.DONE)
        )
    )()
    assert (await first_frame_after_prompt(pages[2]))["code"] == "busy"
    # Both replies of its first battle done: room for two.
    first_battle = await database_sync_to_async(lambda: Message.objects.order_by("id").first().battle_id)()
    await database_sync_to_async(
        lambda: Message.objects.filter(battle_id=first_battle, role=Message.Role.ASSISTANT).update(
            status=Message.Status.DONE
        )
    )()
    assert (await first_frame_after_prompt(pages[2]))["type"] == "battle"
    for communicator in [*pages, voter_b]:
        await communicator.disconnect()


async def test_prompts_sent_at_the_same_instant_cannot_pass_the_cap_together(settings: Any, unserved_llms: Any) -> None:
    """40 first prompts from 40 pages of one /24, sent together through the real consumer and
    answered in any order: the cap is checked and taken in one step (votes.reply_caps.reserve),
    so at most the cap's replies are in flight, and every other prompt is refused with ``busy``
    and stores nothing."""
    settings.ARENA_REPLIES_PER_NETWORK = 4
    network = fresh_network()
    pages = [await open_battle_socket(address=f"{network}.{host}") for host in range(1, 41)]
    battles_before = await database_sync_to_async(Battle.objects.count)()
    for communicator in pages:  # Every frame is in the consumers' inboxes before any is read.
        await communicator.send_to(text_data=json.dumps(PROMPT))
    answers = await asyncio.gather(*(communicator.receive_from(timeout=20) for communicator in pages))
    kinds = [json.loads(answer)["type"] for answer in answers]
    refusals = [json.loads(answer) for answer in answers if json.loads(answer)["type"] == "error"]
    # Two replies a first prompt: two battles fit a cap of 4.
    assert kinds.count("battle") == 2, kinds
    assert len(refusals) == 38 and {refusal["code"] for refusal in refusals} == {"busy"}
    assert await database_sync_to_async(Battle.objects.count)() == battles_before + 2
    for communicator, kind in zip(pages, kinds, strict=True):
        if kind == "battle":  # Its replies are recorded by the time its prompt is published.
            assert json.loads(await communicator.receive_from(timeout=10))["type"] == "prompt"
    assert await database_sync_to_async(reply_caps.in_flight)(f"{network}.7") == 4
    for communicator in pages:
        await communicator.disconnect()
    await sync_to_async(close_query_thread_connections)()
    await sync_to_async(connections.close_all)()


def test_a_reservation_is_given_back_when_its_prompt_fails_and_expires_if_never_given_back(
    settings: Any,
) -> None:
    """A reservation takes its places until its replies are recorded or it is released; one a
    lost process never gave back stops counting after RESERVATION_TTL_SECONDS."""
    settings.ARENA_REPLIES_PER_NETWORK = 3
    address = f"{fresh_network()}.5"
    first = reply_caps.reserve(address, replies=2, now=1000.0)
    with pytest.raises(Exception, match="already has 3 replies"):
        reply_caps.reserve(address, replies=2, now=1001.0)
    first.release()
    second = reply_caps.reserve(address, replies=2, now=1002.0)
    reply_caps.reserve(address, replies=1, now=1003.0)  # Never released: a lost process.
    second.release()
    with pytest.raises(Exception, match="already has 3 replies"):
        reply_caps.reserve(address, replies=3, now=1004.0)
    reply_caps.reserve(address, replies=3, now=1003.0 + reply_caps.RESERVATION_TTL_SECONDS + 1)


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_reservations_taken_by_many_threads_at_once_stay_within_the_cap(settings: Any, store: str) -> None:
    """40 threads released together each reserve a first prompt's two replies from one /24:
    exactly two reservations are granted, with Redis (several web processes) and in the
    process's memory (the embedded arena, one lock)."""
    settings.ARENA_REPLIES_PER_NETWORK = 4
    if store == "memory":
        settings.REDIS_URL = ""
    network = fresh_network()
    start = threading.Barrier(40)

    def reserve(host: int) -> bool:
        start.wait(timeout=10)
        try:
            reply_caps.reserve(f"{network}.{host}", replies=2)
        except ArenaError as error:
            assert error.code == "busy"
            return False
        return True

    with ThreadPoolExecutor(max_workers=40) as pool:
        granted = list(pool.map(reserve, range(1, 41)))
    assert granted.count(True) == 2
