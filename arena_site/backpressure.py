"""Back-pressure on battle sockets: what one client sends or leaves unread stays bounded.

daphne (on Twisted) takes a websocket's frames as fast as they come and queues them for the
consumer without limit, and Twisted buffers without limit what a client has not read yet. The
review's client sent `sync` (15 bytes in, a battle's state out) as fast as it could and never
read: daphne grew by 142 MB in 40 s. It was never dropped either, since autobahn takes incoming
data as an answer to its pings. Two bounds, both on Twisted's own flow control:

- In: once ``MAX_QUEUED_FRAMES`` of a socket's frames wait for the consumer, the server stops
  reading that socket until half have been handled; the client's own TCP window then stops it.
- Out: each socket registers a streaming producer on its TCP transport, Twisted's back-pressure
  hook. When more than the transport's buffer size (64 KB) waits for the client, Twisted pauses
  it: the server stops reading the client (it cannot ask for more while it reads nothing), and
  a client that has not caught up within ``ARENA_SLOW_READER_SECONDS`` is dropped, which
  discards what was buffered for it.

A message over daphne's own size limit (1 MiB: larger than any frame the consumer accepts, which
refuses those over ``ARENA_MAX_FRAME_BYTES`` with ``frame_too_large`` and keeps the socket) never
reaches the consumer: autobahn fails the connection, by dropping it, so the client saw a bare
1006. The subclass first sends ``too_large`` (the arena's ``frame_too_large`` error frame), then
closes with the closing handshake (1009), so the client reads why whatever the frame's size.

Plain HTTP had neither bound: a response (a static file served by WhiteNoise, a dump) was handed
to Twisted as fast as the application produced it, so 250 clients that requested a 3.3 MB file
and read nothing took daphne from 563 to 1,050 MB, never dropped, kept after they closed. Each
HTTP response now registers a streaming producer on its request (``ResponseGate``): while the
transport's buffer is full the application's ``send`` waits (daphne's ``Server.handle_reply``
awaits the gate), so a response waits for its client instead of being buffered whole, and a
client that has not caught up within the same patience is dropped.

daphne offers no hook for its protocols, so ``install`` puts a subclass in its websocket factory
and in its HTTP request factory, and makes its reply coroutine wait for the HTTP gate.
"""

from __future__ import annotations

import asyncio
from typing import Any

from daphne import http_protocol
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from twisted.internet import reactor
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

MAX_QUEUED_FRAMES = 32
DRAIN_CHECK_SECONDS = 0.05
# What Twisted buffers for an HTTP response's client before it pauses the response (its default
# is 64 KiB): the kernel's send buffer holds more, outside the process's memory.
HTTP_BUFFER_BYTES = 8 * 1024


class ReadGate:
    """Reading from a socket, stopped while any reason holds ("in": its frames queue up,
    "out": the client does not read its replies)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.reasons: set[str] = set()

    def close(self, reason: str) -> None:
        if not self.reasons:
            self.transport.stopReading()
        self.reasons.add(reason)

    def open(self, reason: str) -> None:
        self.reasons.discard(reason)
        if not self.reasons and self.transport.connected:
            self.transport.startReading()


@implementer(IPushProducer)
class SlowReaderGuard:
    """Told by the transport when its client falls behind (pause) and catches up (resume): holds
    the sender back meanwhile (``hold``, ``release``), and drops a client that has not caught up
    within ``patience_s``, which frees what was buffered for it."""

    def __init__(self, transport: Any, patience_s: float) -> None:
        self.transport = transport
        self.patience_s = patience_s
        self.deadline: Any = None

    def hold(self) -> None:
        """The client fell behind."""

    def release(self) -> None:
        """The client caught up."""

    def ended(self) -> None:
        """Nothing more is sent: the response ended or the client was dropped."""

    def pauseProducing(self) -> None:
        self.hold()
        if self.deadline is None:
            self.deadline = reactor.callLater(self.patience_s, self.drop)

    def resumeProducing(self) -> None:
        self._cancel()
        self.release()

    def stopProducing(self) -> None:
        self._cancel()
        self.ended()

    def drop(self) -> None:
        self.deadline = None
        self.ended()
        self.transport.abortConnection()

    def _cancel(self) -> None:
        if self.deadline is not None and self.deadline.active():
            self.deadline.cancel()
        self.deadline = None


class OutboundGuard(SlowReaderGuard):
    """A battle socket's: while its client is behind, the server stops reading it too."""

    def __init__(self, transport: Any, gate: ReadGate, patience_s: float) -> None:
        super().__init__(transport, patience_s)
        self.gate = gate

    def hold(self) -> None:
        self.gate.close("out")

    def release(self) -> None:
        self.gate.open("out")


def guarded_protocol(patience_s: float, too_large: bytes = b"") -> type[WebSocketProtocol]:
    class GuardedWebSocketProtocol(WebSocketProtocol):
        gate: ReadGate | None = None

        def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
            # autobahn's hook for a message over its limit: say why first, then close with the
            # handshake rather than a drop, so that the client reads both.
            if too_large and self.state == self.STATE_OPEN:
                self.sendMessage(too_large, isBinary=False)
            self.failByDrop = False
            super()._max_message_size_exceeded(msg_size, max_msg_size, reason)

        def onOpen(self) -> None:
            super().onOpen()
            transport = self.transport
            if transport.producer is not None:  # daphne's HTTP channel, which handed the socket over
                transport.unregisterProducer()
            self.gate = ReadGate(transport)
            transport.registerProducer(OutboundGuard(transport, self.gate, patience_s), True)

        def onMessage(self, payload: bytes, isBinary: bool) -> None:
            super().onMessage(payload, isBinary)
            queue = getattr(self, "application_queue", None)
            gate = self.gate
            if (
                gate is not None
                and queue is not None
                and queue.qsize() >= MAX_QUEUED_FRAMES
                and "in" not in gate.reasons
            ):
                gate.close("in")
                reactor.callLater(DRAIN_CHECK_SECONDS, self._read_again_once_drained)

        def _read_again_once_drained(self) -> None:
            assert self.gate is not None
            if self.application_queue.qsize() > MAX_QUEUED_FRAMES // 2 and self.transport.connected:
                reactor.callLater(DRAIN_CHECK_SECONDS, self._read_again_once_drained)
                return
            self.gate.open("in")

    return GuardedWebSocketProtocol


class ResponseGate(SlowReaderGuard):
    """One HTTP response's: open (``writable``) while the client takes what is written, shut
    while the transport's buffer is full; the application's send waits for it."""

    def __init__(self, transport: Any, patience_s: float) -> None:
        super().__init__(transport, patience_s)
        self.writable = asyncio.Event()
        self.writable.set()

    def hold(self) -> None:
        self.writable.clear()

    def release(self) -> None:
        self.writable.set()

    def ended(self) -> None:
        self.writable.set()  # The application's send returns; daphne ignores what follows.


def gated_request(patience_s: float) -> type[http_protocol.WebRequest]:
    class GatedWebRequest(http_protocol.WebRequest):
        gate: ResponseGate | None = None

        def handle_reply(self, message: dict[str, Any]) -> None:
            if (
                message.get("type") == "http.response.start"
                and self.gate is None
                and self.channel is not None
                and not self.finished
            ):
                self.gate = ResponseGate(self.channel.transport, patience_s)
                self.channel.transport.bufferSize = HTTP_BUFFER_BYTES
                self.registerProducer(self.gate, True)
            super().handle_reply(message)

        def finish(self) -> None:
            self._release()
            super().finish()

        def connectionLost(self, reason: Any) -> None:
            self._release()
            super().connectionLost(reason)

        def _release(self) -> None:
            if self.gate is not None:
                self.gate.stopProducing()
                if self.producer is not None:
                    self.unregisterProducer()

    return GatedWebRequest


_daphne_handle_reply = Server.handle_reply


async def _handle_reply_when_writable(self: Server, protocol: Any, message: dict[str, Any]) -> None:
    """daphne's reply coroutine, then, for an HTTP body, a wait until its client takes more."""
    await _daphne_handle_reply(self, protocol, message)
    gate = getattr(protocol, "gate", None)
    if isinstance(gate, ResponseGate) and message.get("type") == "http.response.body":
        await gate.writable.wait()


def install(patience_s: float, too_large: bytes = b"") -> None:
    """``too_large``: the text frame a client gets before a message over daphne's limit closes
    its socket."""
    WebSocketFactory.protocol = guarded_protocol(patience_s, too_large)
    # HTTPFactory.buildProtocol reads the module's WebRequest for each connection.
    http_protocol.WebRequest = gated_request(patience_s)  # type: ignore[misc]
    Server.handle_reply = _handle_reply_when_writable  # type: ignore[method-assign]
