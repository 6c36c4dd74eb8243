"""What one websocket client sends, or leaves unread, stays bounded (arena_site/backpressure.py).

The review's socket sent ``sync`` frames and never read: daphne buffered every answer and grew by
142 MB in 40 s, kept after the close. A real daphne process and raw sockets: a client that never
reads is dropped and daphne's resident memory comes back within 10% of before; a client that
reads but sends as fast as its socket takes keeps daphne's memory within 10% of before as well
(its frames wait in the network, not in daphne). Without these bounds the first client grew
daphne from 185 MB to 692 MB in 30 s, and was never dropped.
"""

import base64
import json
import os
import socket
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ninja
import pytest
from django.db import connection

from votes.models import Task
from votes.testing.stack import Stack, database_url
from votes.testing.voters import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

PATIENCE_S = 2
SYNC = b'{"type":"sync"}'


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def masked_text_frame(payload: bytes) -> bytes:
    """A client's websocket text frame (clients must mask theirs), of any length."""
    mask = os.urandom(4)
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")
    if len(payload) < 126:
        header = struct.pack("!BB", 0x81, 0x80 | len(payload))
    elif len(payload) < 1 << 16:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, len(payload))
    else:
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, len(payload))
    return header + mask + masked


def read_server_frame(client: socket.socket) -> tuple[int, bytes]:
    """One frame from the server (unmasked): its opcode and payload."""

    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = client.recv(count - len(data))
            assert chunk, "the server closed the connection without a closing frame"
            data += chunk
        return data

    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", exactly(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", exactly(8))
    return first & 0x0F, exactly(length)


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


def flood(client: socket.socket, seconds: float, pid: int) -> tuple[bool, int]:
    """Send sync frames as fast as the socket takes them for ``seconds``: whether the server
    dropped the connection, and daphne's largest resident memory meanwhile."""
    frames = masked_text_frame(SYNC) * 20
    deadline = time.monotonic() + seconds
    peak = rss_bytes(pid)
    while time.monotonic() < deadline:
        try:
            client.sendall(frames)
        except (ConnectionResetError, BrokenPipeError):
            return True, peak
        except TimeoutError:  # The server reads nothing more for now: it waits.
            pass
        peak = max(peak, rss_bytes(pid))
    return False, peak


@pytest.fixture
def daphne(tmp_path: Path, settings: Any) -> Any:
    # The state frame a sync gets lists the active tasks: with these, about 40 KB, as the
    # review's 29 KB.
    Task.objects.bulk_create(Task(slug=f"long-title-{i}", title=f"{i:03d} " + "t" * 190) for i in range(150))
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        # Every frame answered (the frame rate limit off): only the back-pressure bounds the flood.
        env={"ARENA_SLOW_READER_SECONDS": str(PATIENCE_S), "ARENA_RATE_LIMITS": "frame=0/0/60"},
    )
    try:
        web, url = stack.start_web()
        port = int(url.rsplit(":", 1)[1])
        cookie = session_cookie(url)
        # Warm up the socket path (first imports, query threads) with a page that reads.
        reader = open_websocket(port, cookie)
        for _ in range(3):
            reader.sendall(masked_text_frame(SYNC))
            assert reader.recv(65536)
        reader.close()
        time.sleep(0.5)
        yield web.process.pid, port, cookie
    finally:
        stack.stop()


def test_a_client_that_does_not_read_is_dropped_and_its_memory_freed(daphne: Any) -> None:
    pid, port, cookie = daphne
    before = rss_bytes(pid)
    client = open_websocket(port, cookie, receive_buffer=4096)
    dropped, peak = flood(client, seconds=25, pid=pid)
    client.close()
    assert dropped, "a socket that never reads was not dropped"
    deadline = time.monotonic() + 10
    while (after := rss_bytes(pid)) > before * 1.1 and time.monotonic() < deadline:
        time.sleep(0.2)
    mib = 2**20
    assert after <= before * 1.1, f"daphne's RSS {before / mib:.0f} MiB before, {after / mib:.0f} after"
    assert peak <= before * 1.1, f"daphne's RSS {before / mib:.0f} MiB before, {peak / mib:.0f} at most"


def test_a_client_that_reads_but_floods_is_held_back_not_buffered(daphne: Any) -> None:
    pid, port, cookie = daphne
    before = rss_bytes(pid)
    client = open_websocket(port, cookie)
    received = 0

    def read() -> None:
        nonlocal received
        try:
            while chunk := client.recv(1 << 20):
                received += len(chunk)
        except OSError:
            return

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    dropped, peak = flood(client, seconds=5, pid=pid)
    client.close()
    reading.join(timeout=10)
    assert not dropped and received > 1_000_000  # served all along, as fast as daphne handles it
    mib = 2**20
    assert peak <= before * 1.1, f"daphne's RSS {before / mib:.0f} MiB before, {peak / mib:.0f} at most"


@pytest.mark.parametrize("size", [64 * 1024, 2 * 2**20])
def test_a_frame_over_the_limit_is_told_frame_too_large_whatever_its_size(daphne: Any, size: int) -> None:
    """Over ARENA_MAX_FRAME_BYTES the consumer refuses the frame and the socket stays; over
    daphne's own 1 MiB limit the frame never reaches the consumer, and the client is still told
    ``frame_too_large`` before a clean close (1009), not a dropped connection (1006)."""
    _, port, cookie = daphne
    client = open_websocket(port, cookie)
    prompt = b'{"type": "prompt", "text": "' + b"x" * size + b'"}'
    client.sendall(masked_text_frame(prompt))
    opcode, payload = read_server_frame(client)
    assert opcode == 0x1 and json.loads(payload)["code"] == "frame_too_large", payload[:200]
    if size < 2**20:  # The socket goes on: a sync is answered.
        client.sendall(masked_text_frame(SYNC))
        opcode, payload = read_server_frame(client)
        assert opcode == 0x1 and json.loads(payload)["type"] == "state"
    else:
        opcode, payload = read_server_frame(client)
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1009, payload
    client.close()


STATIC = "/static/ninja/redoc.standalone.js.map"  # 3.3 MB: the largest file the site serves.


def request_without_reading(port: int, path: str) -> socket.socket:
    """A plain HTTP GET whose response is never read (a small receive window: the kernel holds
    little for the client, as for a client that stopped reading)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.settimeout(5)
    client.connect(("127.0.0.1", port))
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    return client


def open_sockets(pid: int) -> int:
    """How many sockets the process holds open."""
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            held += os.readlink(fd).startswith("socket:")
        except FileNotFoundError:  # Closed while listed.
            continue
    return held


def test_plain_http_clients_that_do_not_read_are_dropped_and_their_memory_freed(daphne: Any) -> None:
    """250 sockets request the site's largest static file (3.3 MB) at once and never read: each
    response waits for its client instead of being held whole (daphne grows by less than a
    tenth of the file per socket), the clients are dropped after ARENA_SLOW_READER_SECONDS, and
    once they close daphne's memory is within 10% of what it was after 250 clients that read had
    fetched the file at once. Without these bounds the same sockets took
    daphne from 207 to 1211 MiB, never dropped, kept after they closed."""
    pid, port, _ = daphne
    size = len((Path(ninja.__file__).parent / "static" / STATIC.removeprefix("/static/")).read_bytes())
    # The baseline: daphne once 250 clients that read have fetched the file at the same time.
    readers = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(250)]
    for reader in readers:
        reader.sendall(f"GET {STATIC} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())

    def read_all(reader: socket.socket) -> int:
        received = 0
        while chunk := reader.recv(1 << 20):
            received += len(chunk)
        reader.close()
        return received

    with ThreadPoolExecutor(max_workers=250) as pool:
        assert all(received > size for received in pool.map(read_all, readers))
    before, sockets_before = rss_bytes(pid), open_sockets(pid)
    clients = [request_without_reading(port, STATIC) for _ in range(250)]
    # Still open at the client, which reads nothing: daphne drops them once their patience is out.
    deadline = time.monotonic() + PATIENCE_S + 10
    peak = rss_bytes(pid)
    while (held := open_sockets(pid)) > sockets_before + 5 and time.monotonic() < deadline:
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.2)
    assert held <= sockets_before + 5, f"daphne still holds {held - sockets_before} of the clients' sockets"
    for client in clients:
        client.close()
    deadline = time.monotonic() + 10
    while (after := rss_bytes(pid)) > before * 1.1 and time.monotonic() < deadline:
        time.sleep(0.2)
    mib = 2**20
    print(
        f"daphne's RSS {before / mib:.0f} MiB before, {peak / mib:.0f} MiB at most with 250 unread "
        f"responses of {size / mib:.1f} MiB, {after / mib:.0f} MiB after"
    )
    assert (peak - before) / 250 < size / 10, f"{(peak - before) / 250 / 1024:.0f} KiB a socket"
    assert after <= before * 1.1, f"daphne's RSS {before / mib:.0f} MiB before, {after / mib:.0f} after"


def test_a_compressed_static_file_arrives_whole_as_one_gzip_stream(daphne: Any) -> None:
    """Under daphne a static file is pulled a chunk at a time and compressed as one gzip stream:
    a browser reads only a body's first gzip stream, and Django compresses an asynchronous body
    chunk by chunk, one stream each (the arena's script arrived as its first 8 KB)."""
    _, port, _ = daphne
    path = Path(__file__).resolve().parents[1] / "votes" / "static" / "votes" / "arena.js"
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(
        b"GET /static/votes/arena.js HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    )
    response = b""
    while chunk := client.recv(1 << 20):
        response += chunk
    client.close()
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-encoding: gzip" in head.lower()
    if b"transfer-encoding: chunked" in head.lower():
        whole, rest = b"", body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            whole, rest = whole + rest[:size], rest[size + 2 :]
        body = whole
    first_stream = zlib.decompressobj(16 + zlib.MAX_WBITS)  # One gzip stream, as a browser reads.
    assert first_stream.decompress(body) == path.read_bytes()
