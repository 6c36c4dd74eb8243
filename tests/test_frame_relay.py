"""The frame relay (votes/relay.py): a worker's frames reach the battle's group through a
process of its own, in order per group, and a relay that dies is replaced; the worker's own
priority can be lowered while the relay keeps the normal one."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from votes.relay import FrameRelay, RelayServer

ROOT = settings.BASE_DIR


@pytest.fixture
def relay() -> Iterator[FrameRelay]:
    relay = FrameRelay()
    yield relay
    relay.close()


async def receive_frames(channel: str, count: int) -> list[dict]:
    layer = get_channel_layer()
    frames: list[dict] = []
    while len(frames) < count:
        message = await asyncio.wait_for(layer.receive(channel), timeout=30)
        assert message["type"] == "battle.frames"
        frames.extend(message["frames"])
    return frames


async def test_frames_reach_each_group_in_order(relay: FrameRelay, settings) -> None:
    settings.ARENA_TRACE_FRAMES = True
    layer = get_channel_layer()
    groups = [f"battle.{uuid.uuid4().hex}" for _ in range(2)]
    channels = [await layer.new_channel() for _ in groups]
    for group, channel in zip(groups, channels, strict=True):
        await layer.group_add(group, channel)

    for seq in range(100):
        for side, group in zip("ab", groups, strict=True):
            await asyncio.to_thread(relay.publish, group, [{"type": "delta", "side": side, "seq": seq, "text": "\n"}])

    for side, channel in zip("ab", channels, strict=True):
        frames = await receive_frames(channel, 100)
        assert [frame["seq"] for frame in frames] == list(range(100))
        assert {frame["side"] for frame in frames} == {side}
        assert all(frame["text"] == "\n" for frame in frames)  # one JSON line each, whatever the text
        # Traced: published by the worker, then read by the relay.
        assert all(frame["sent_at"] <= frame["left_worker_at"] for frame in frames)


async def test_a_relay_that_died_is_replaced(relay: FrameRelay) -> None:
    layer = get_channel_layer()
    group, channel = f"battle.{uuid.uuid4().hex}", await layer.new_channel()
    await layer.group_add(group, channel)
    await asyncio.to_thread(relay.publish, group, [{"type": "delta", "seq": 0}])
    assert [frame["seq"] for frame in await receive_frames(channel, 1)] == [0]
    first = relay.pid
    assert first is not None

    os.kill(first, signal.SIGKILL)
    relay.process.wait()  # type: ignore[union-attr]
    await asyncio.to_thread(relay.publish, group, [{"type": "delta", "seq": 1}])

    assert [frame["seq"] for frame in await receive_frames(channel, 1)] == [1]
    assert relay.pid not in (None, first)


def test_the_relay_exits_when_its_worker_goes(relay: FrameRelay) -> None:
    relay.start()
    process = relay.process
    assert process is not None and process.poll() is None
    relay.close()  # what the kernel does to the pipe when the worker dies
    assert process.returncode == 0


def test_lower_priority_covers_every_thread_but_not_a_child_started_before() -> None:
    script = """
import os, subprocess, sys, threading
from arena_site.priority import lower_priority
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
ready, done = threading.Event(), threading.Event()
def run():
    ready.set()
    done.wait()
thread = threading.Thread(target=run)
thread.start()
ready.wait()
print(lower_priority(5, idle=True))
tids = [int(task) for task in os.listdir("/proc/self/task")]
print(sorted({os.getpriority(os.PRIO_PROCESS, tid) for tid in tids}))
print(sorted({os.sched_getscheduler(tid) == os.SCHED_IDLE for tid in tids}))
def report():
    tid = threading.get_native_id()
    print(os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid) == os.SCHED_IDLE)
late = threading.Thread(target=report)
late.start(); late.join()
print(os.getpriority(os.PRIO_PROCESS, child.pid), os.sched_getscheduler(child.pid) == os.SCHED_IDLE)
done.set(); thread.join(); child.stdin.close(); child.wait()
"""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    changed, niceness, idle, late_thread, child = result.stdout.split("\n")[:5]
    lowered = min(base + 5, 19)
    assert int(changed) >= 2  # the main thread and the other one
    assert (niceness, idle) == (f"[{lowered}]", "[True]")
    assert late_thread == f"{lowered} True"  # threads started later inherit both
    assert child == f"{base} False"  # the relay, started before, keeps its priority


class HeldLayer:
    """A channel layer whose sends to one group wait until the test lets them go."""

    def __init__(self, held_group: str) -> None:
        self.held_group = held_group
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[tuple[str, list[int]]] = []

    async def group_send(self, group: str, message: dict) -> None:
        if group == self.held_group:
            self.holding.set()
            await self.release.wait()
        self.sent.append((group, [frame["seq"] for frame in message["frames"]]))


def frame_line(group: str, seq: int) -> bytes:
    return json.dumps({"group": group, "frames": [{"type": "delta", "seq": seq}]}).encode() + b"\n"


async def test_frames_queued_behind_a_send_go_out_together_in_order() -> None:
    layer = HeldLayer(held_group="battle.slow")
    reader = asyncio.StreamReader()
    serving = asyncio.create_task(RelayServer(layer).serve(reader))
    reader.feed_data(frame_line("battle.slow", 0))
    await asyncio.wait_for(layer.holding.wait(), timeout=10)
    for seq in range(1, 5):  # while frame 0 is being sent
        reader.feed_data(frame_line("battle.slow", seq))
    reader.feed_data(frame_line("battle.fast", 0))

    async def fast_group_sent() -> None:
        while ("battle.fast", [0]) not in layer.sent:
            await asyncio.sleep(0)

    await asyncio.wait_for(fast_group_sent(), timeout=10)  # another group is not held up behind it
    assert all(group == "battle.fast" for group, _ in layer.sent)

    layer.release.set()
    reader.feed_eof()
    await asyncio.wait_for(serving, timeout=10)

    assert [seqs for group, seqs in layer.sent if group == "battle.slow"] == [[0], [1, 2, 3, 4]]
