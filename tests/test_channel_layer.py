"""The channel layer (arena_site/channel_layer.py), against the real Redis: consumers that leave
never take another consumer's messages with them; order and errors are kept; group sends keep
channels_redis's capacity and expiry."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio
from django.conf import settings

from arena_site.channel_layer import PumpedRedisChannelLayer
from votes.testing.stack import free_port


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


async def test_group_send_keeps_capacity_and_expiry(layer: PumpedRedisChannelLayer) -> None:
    """The two-round-trip group send keeps channels_redis's rules: a full channel gets nothing
    more, a member whose membership expired is dropped, and so are expired messages."""
    small = PumpedRedisChannelLayer(hosts=[settings.REDIS_URL], prefix=layer.prefix, capacity=2)
    member, stale = await small.new_channel(), await small.new_channel()
    await small.group_add("battle", member)
    await small.group_add("battle", stale)
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    await client.zadd(small._group_key("battle"), {stale: 0})  # added long before group_expiry
    for seq in range(3):
        await small.group_send("battle", {"type": "frame", "seq": seq})

    assert await client.zrange(small._group_key("battle"), 0, -1) == [member.encode()]
    assert [(await small.receive(member))["seq"] for _ in range(2)] == [0, 1]  # the third did not fit
    assert small.receive_buffer.get(stale) is None

    # A message older than expiry is dropped by the next send to its key (that of another web
    # process, which is not reading).
    elsewhere = await PumpedRedisChannelLayer(hosts=[settings.REDIS_URL], prefix=layer.prefix).new_channel()
    await small.group_add("battle", elsewhere)
    key = small.prefix + small.non_local_name(elsewhere)
    await client.zadd(key, {b"an expired message": 0})
    await small.group_send("battle", {"type": "frame", "seq": 3})
    assert await client.zrange(key, 0, -1) != [b"an expired message"]
    assert await client.zcount(key, "-inf", "+inf") == 1
    assert (await small.receive(member))["seq"] == 3
    await client.aclose()
    await small.flush()
