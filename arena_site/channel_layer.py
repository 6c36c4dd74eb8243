"""The Redis channel layer: one receiver per process that is never cancelled, cheaper group sends.

channels_redis keeps every message for a process's consumers in one Redis sorted set. Its
`receive()` lets whichever consumer holds a lock pop the next message (BZPOPMIN) and hand it
to its addressee. When that consumer is cancelled mid-pop, because its own websocket closed,
redis-py drops the popped message (django/channels_redis#366, django/channels#1683): another
voter's frame is lost. The load test saw exactly that as voters left: a gap in one reply's
deltas, and once a battle waiting forever for an end frame.

Here one long-lived task per process and event loop (the pump) pops messages and puts them
in the addressees' buffers; a consumer's `receive()` only waits on its own buffer, so
cancelling it loses nothing of anyone else's. The pump also pops up to PUMP_BATCH waiting
messages per Redis round trip instead of one message per four round trips, which keeps a
busy web process from falling behind; and `group_send` takes two round trips instead of four.
Nothing else changes: groups, capacity and expiry are channels_redis's own. The subclass uses
channels_redis 4.3's internals (`receive_buffer`, `connection`, `deserialize`,
`_map_channel_keys_to_connection`), which is why that version is pinned.
"""

import asyncio
import logging
import time
from typing import Any

from channels_redis.core import RedisChannelLayer

logger = logging.getLogger(__name__)

# Messages taken from Redis per round trip when several are waiting.
PUMP_BATCH = 100

# channels_redis's group-send script, with the removal of expired messages (its own separate
# round trip there) done first for each key.
GROUP_SEND = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 2]
local expiry = ARGV[#ARGV - 1]
local expired_before = ARGV[#ARGV]
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired_before)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class PumpedRedisChannelLayer(RedisChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pumps: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Task[None]] = {}
        # Channels with a consumer in receive() now, and when each channel was last read: a
        # buffer nobody has read for `expiry` seconds belongs to a consumer that is gone.
        self.waiting: dict[str, int] = {}
        self.last_read: dict[str, float] = {}
        self.last_sweep = time.monotonic()

    async def receive(self, channel: str) -> dict[str, Any]:
        assert self.require_valid_channel_name(channel)
        if "!" not in channel:  # A channel of no process in particular: channels_redis's own way.
            return await super().receive(channel)
        pump = self._pump(self.non_local_name(channel))
        self.waiting[channel] = self.waiting.get(channel, 0) + 1
        try:
            buffer = self.receive_buffer[channel]
            if buffer.empty():
                getter = asyncio.ensure_future(buffer.get())
                try:
                    await asyncio.wait({getter, pump}, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    # This consumer is leaving: what was for it alone goes with it.
                    getter.cancel()
                    self.receive_buffer.pop(channel, None)
                    raise
                if not getter.done():  # The pump failed (Redis went away): so does this consumer.
                    getter.cancel()
                    error = None if pump.cancelled() else pump.exception()
                    raise error or ConnectionError("The channel layer's receiver stopped.")
                message: dict[str, Any] = getter.result()
            else:
                message = buffer.get_nowait()
            if buffer.empty():
                self.receive_buffer.pop(channel, None)
            return message
        finally:
            self.last_read[channel] = time.monotonic()
            self.waiting[channel] -= 1
            if not self.waiting[channel]:
                del self.waiting[channel]

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """channels_redis's group send in two round trips instead of four: the group's expired
        members are dropped and the rest read in one pipeline, then one script per Redis shard
        drops expired messages and adds the new one to each addressee's key, within capacity."""
        assert self.require_valid_group_name(group), "Group name not valid"
        group_key = self._group_key(group)
        async with self.connection(self.consistent_hash(group)).pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(group_key, min=0, max=int(time.time()) - self.group_expiry)
            pipe.zrange(group_key, 0, -1)
            _, members = await pipe.execute()
        channels = [member.decode("utf8") for member in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channels, message)
        for index, keys in by_connection.items():
            now = time.time()
            args = [messages[key] for key in keys] + [capacities[key] for key in keys]
            args += [now, self.expiry, int(now) - int(self.expiry)]
            over_capacity = await self.connection(index).eval(GROUP_SEND, len(keys), *keys, *args)
            if over_capacity:
                logger.info("%s of %s channels over capacity in group %s", over_capacity, len(channels), group)

    def _pump(self, real_channel: str) -> asyncio.Task[None]:
        """This loop's pump for the process channel, started if there is none (or it failed)."""
        key = (asyncio.get_running_loop(), real_channel)
        pump = self.pumps.get(key)
        if pump is None or pump.done():
            pump = asyncio.ensure_future(self._run_pump(real_channel))
            pump.add_done_callback(_log_pump_end)
            self.pumps[key] = pump
        return pump

    async def _run_pump(self, real_channel: str) -> None:
        channel_key = self.prefix + real_channel
        connection = self.connection(self.consistent_hash(real_channel))
        while True:
            popped = await connection.zpopmin(channel_key, PUMP_BATCH)
            if not popped:
                result = await connection.bzpopmin(channel_key, timeout=self.brpop_timeout)
                popped = [result[1:]] if result is not None else []
            for member, _score in popped:
                self._deliver(self.deserialize(member))
            self._sweep()

    def _deliver(self, message: dict[str, Any]) -> None:
        addressees = message.pop("__asgi_channel__", None)
        if addressees is None:
            logger.error("Channel layer message without an addressee dropped: %.200r", message)
            return
        for channel in addressees if isinstance(addressees, list) else [addressees]:
            self.last_read.setdefault(channel, time.monotonic())
            self.receive_buffer[channel].put_nowait(message)

    def _sweep(self) -> None:
        """Drop the buffers of consumers that are gone: no read for `expiry` seconds (after that
        long channels_redis expires messages in Redis too)."""
        now = time.monotonic()
        if now - self.last_sweep < min(self.expiry, 10):
            return
        self.last_sweep = now
        for channel, read in list(self.last_read.items()):
            if channel not in self.waiting and now - read > self.expiry:
                self.receive_buffer.pop(channel, None)
                del self.last_read[channel]

    async def flush(self) -> None:
        self._stop_pumps()
        await super().flush()

    async def close_pools(self) -> None:
        self._stop_pumps()
        await super().close_pools()

    def _stop_pumps(self) -> None:
        loop = asyncio.get_running_loop()
        for key, pump in list(self.pumps.items()):
            if key[0] is loop:
                pump.cancel()
                del self.pumps[key]


def _log_pump_end(pump: asyncio.Task[None]) -> None:
    if not pump.cancelled() and pump.exception() is not None:
        error = pump.exception()
        logger.warning("Channel layer receiver stopped (%s: %s); consumers reconnect", type(error).__name__, error)
