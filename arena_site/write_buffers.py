"""A bound on what daphne buffers for a websocket client that does not read.

Daphne writes every outgoing frame straight to the connection's Twisted transport, which buffers
whatever the client has not taken, without limit: a socket that sent ``sync`` frames and never
read grew daphne by 142 MB in 40 s. Installed in the daphne process (arena_site.asgi), each
frame daphne is about to send first checks the bytes its transport still holds; past
``ARENA_WS_MAX_BUFFERED_BYTES`` the connection is aborted (no closing handshake: the client is
not reading it), which discards the buffer and ends the consumer as any disconnect does.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def buffered_bytes(transport: Any) -> int:
    """Bytes a Twisted TCP transport holds that the peer has not yet taken (its write buffer and
    the writes not yet joined into it); 0 for a transport that keeps no such buffer."""
    data = getattr(transport, "dataBuffer", b"")
    return len(data) - getattr(transport, "offset", 0) + getattr(transport, "_tempDataLen", 0)


def bound_websocket_write_buffers(max_bytes: int) -> None:
    """Make daphne's websocket protocol drop a client whose unread output passes ``max_bytes``
    (0: no bound). Idempotent; does nothing where daphne is not installed."""
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:  # pragma: no cover - daphne is a dependency
        return
    unbounded = getattr(WebSocketProtocol.serverSend, "unbounded", WebSocketProtocol.serverSend)
    if max_bytes <= 0:
        WebSocketProtocol.serverSend = unbounded
        return

    def server_send(self: Any, content: Any, binary: bool = False) -> None:
        transport = getattr(self, "transport", None)
        if transport is not None and buffered_bytes(transport) > max_bytes:
            if not getattr(self, "dropped_for_not_reading", False):
                self.dropped_for_not_reading = True
                logger.warning(
                    "Websocket of %s dropped: it left more than %d bytes unread", self.client_addr, max_bytes
                )
                transport.abortConnection()
            return
        unbounded(self, content, binary)

    server_send.unbounded = unbounded  # type: ignore[attr-defined]
    WebSocketProtocol.serverSend = server_send
