"""A client that does not read is dropped and its memory freed (arena_site/write_buffers.py).

The review's socket sent ``sync`` frames and never read: daphne buffered every answer and grew by
142 MB in 40 s, kept after the close. Here a real daphne process, a raw socket doing the same:
it is disconnected once daphne holds ARENA_WS_MAX_BUFFERED_BYTES for it, and daphne's resident
memory is back within 10% of what it was before."""

import base64
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from arena_site.stack import Stack, database_url
from arena_site.write_buffers import buffered_bytes
from votes.loadtest import session_cookie
from votes.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

MAX_BUFFERED = 256 * 1024
SYNC = b'{"type":"sync"}'


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def masked_text_frame(payload: bytes) -> bytes:
    """A client's websocket text frame (clients must mask theirs)."""
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    assert len(payload) < 126
    return struct.pack("!BB", 0x81, 0x80 | len(payload)) + mask + masked


def open_websocket(port: int, cookie: str, *, receive_buffer: int | None = None) -> socket.socket:
    """A raw websocket to /ws/battle/, handshake done, nothing else read."""
    client = socket.socket()
    if receive_buffer:  # Before connecting: a small window, so the kernel holds little for us.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    client.settimeout(5)
    client.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    client.sendall(
        (
            f"GET /ws/battle/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: http://127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += client.recv(1)  # Byte by byte: nothing past the handshake is read.
    assert response.startswith(b"HTTP/1.1 101"), response
    return client


def flood_without_reading(client: socket.socket, limit_s: float) -> bool:
    """Send sync frames, never reading, until the server drops the connection; whether it did."""
    frame = masked_text_frame(SYNC)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            client.sendall(frame * 20)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            continue
        time.sleep(0.002)  # Keep within what one daphne answers; the buffer still grows.
    return False


def test_buffered_bytes_counts_what_the_transport_holds() -> None:
    class Transport:
        dataBuffer = b"x" * 100
        offset = 30
        _tempDataLen = 5

    assert buffered_bytes(Transport()) == 75
    assert buffered_bytes(object()) == 0


def test_a_client_that_does_not_read_is_dropped_and_its_memory_freed(tmp_path: Path, settings: Any) -> None:
    # The state frame a sync gets lists the active tasks: with these, about 40 KB, as the
    # review's 29 KB.
    Task.objects.bulk_create(Task(slug=f"long-title-{i}", title=f"{i:03d} " + "t" * 190) for i in range(150))
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        # Every frame answered (the frame rate limit off): only the buffer bound stops the flood.
        env={"ARENA_WS_MAX_BUFFERED_BYTES": str(MAX_BUFFERED), "ARENA_RATE_LIMITS": "frame=0/0/60"},
    )
    try:
        web, url = stack.start_web()
        port = int(url.rsplit(":", 1)[1])
        cookie = session_cookie(url)
        # Warm up the socket path (first imports, query threads) with a page that reads.
        reader = open_websocket(port, cookie)
        reader.sendall(masked_text_frame(SYNC))
        assert reader.recv(65536)
        reader.close()
        time.sleep(0.5)
        before = rss_bytes(web.process.pid)

        client = open_websocket(port, cookie, receive_buffer=4096)
        assert flood_without_reading(client, limit_s=25), "a socket that never reads was not dropped"
        client.close()
        assert "left more than" in web.log.read_text(errors="replace")

        deadline = time.monotonic() + 10
        while (after := rss_bytes(web.process.pid)) > before * 1.1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert after <= before * 1.1, f"daphne's RSS {before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after"
    finally:
        stack.stop()
