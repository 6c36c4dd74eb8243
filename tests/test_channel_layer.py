"""The channel layer's receiver (arena_site/channel_layer.py), against the real Redis: consumers
that leave never take another consumer's messages with them; order and errors are kept."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from django.conf import settings

from arena_site.channel_layer import PumpedRedisChannelLayer
from arena_site.stack import free_port


@pytest.fixture
async def layer() -> AsyncIterator[PumpedRedisChannelLayer]:
    layer = PumpedRedisChannelLayer(
        hosts=[settings.REDIS_URL],
        prefix=f"test-{uuid.uuid4().hex[:8]}",
        capacity=settings.CHANNEL_LAYERS["default"]["CONFIG"]["capacity"],
    )
    yield layer
    await layer.flush()


async def test_consumers_leaving_lose_none_of_another_consumers_messages(layer: PumpedRedisChannelLayer) -> None:
    """Channels_redis's own receive() loses a message whenever the consumer popping it for the
    whole process is cancelled; here voters come and go while another one's reply streams."""
    streaming = await layer.new_channel()
    await layer.group_add("battle", streaming)
    received: list[int] = []

    async def read_stream() -> None:
        while len(received) < 300:
            received.append((await layer.receive(streaming))["seq"])

    reader = asyncio.create_task(read_stream())
    for seq in range(300):
        leaving = asyncio.create_task(layer.receive(await layer.new_channel()))
        await layer.group_send("battle", {"type": "frame", "seq": seq})
        await asyncio.sleep(0)  # the leaving consumer starts waiting, maybe takes its turn...
        leaving.cancel()  # ...and its websocket closes
    await asyncio.wait_for(reader, timeout=30)

    assert received == list(range(300))


async def test_messages_waiting_in_redis_arrive_in_order(layer: PumpedRedisChannelLayer) -> None:
    first, second = await layer.new_channel(), await layer.new_channel()
    for seq in range(250):  # more than one batch, sent before anyone reads
        await layer.send(first if seq % 2 else second, {"type": "frame", "seq": seq})

    firsts = [(await layer.receive(first))["seq"] for _ in range(125)]
    seconds = [(await layer.receive(second))["seq"] for _ in range(125)]

    assert firsts == list(range(1, 250, 2))
    assert seconds == list(range(0, 250, 2))


async def test_buffers_of_departed_consumers_are_dropped(layer: PumpedRedisChannelLayer) -> None:
    staying, departed = await layer.new_channel(), await layer.new_channel()
    await layer.send(departed, {"type": "frame", "text": "nobody reads this"})
    await layer.send(staying, {"type": "frame", "text": "one"})
    assert (await layer.receive(staying))["text"] == "one"
    assert departed in layer.receive_buffer  # taken from Redis for a consumer that never came

    # As if expiry seconds had passed since anyone read it.
    layer.last_read[departed] -= layer.expiry + 1
    layer.last_sweep -= layer.expiry + 1
    await layer.send(staying, {"type": "frame", "text": "two"})
    assert (await layer.receive(staying))["text"] == "two"

    assert departed not in layer.receive_buffer and departed not in layer.last_read
    assert staying in layer.last_read


async def test_receive_fails_when_redis_is_unreachable() -> None:
    layer = PumpedRedisChannelLayer(hosts=[f"redis://127.0.0.1:{free_port()}/0"])
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        await asyncio.wait_for(layer.receive(await layer.new_channel()), timeout=30)
    assert time.monotonic() - started < 30
