"""Embedded mode: no broker, replies generated on threads of the web process, in-memory layer."""

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers

from votes.models import Message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def embedded_mode(settings):
    settings.GENERATION_BACKEND = "in-process"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()  # channels caches the layer built from the old setting
    yield
    channel_layers.backends.clear()


async def test_in_process_worker_streams_both_sides(embedded_mode, connect_battle, demo_llms) -> None:
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    assert (await client.receive())["type"] == "battle"
    assert (await client.receive())["type"] == "prompt"
    frames = await client.receive_both_ends()

    replies = await database_sync_to_async(list)(Message.objects.filter(role=Message.Role.ASSISTANT))
    assert len(replies) == 2
    for reply in replies:
        deltas = [f for f in frames if f["type"] == "delta" and f["side"] == reply.side]
        assert [d["seq"] for d in deltas] == list(range(len(deltas)))
        assert reply.status == Message.Status.DONE
        assert reply.content == "".join(d["text"] for d in deltas)
