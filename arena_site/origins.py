"""Which pages may open the battle socket: the site's own, by scheme, host and port.

channels' ``AllowedHostsOriginValidator`` compares the Origin's host with ``ALLOWED_HOSTS`` and
nothing else, so a page served from another port or over plain http on the same host passed.
Here the Origin must be the page's own origin, the one the socket request itself was made to
(its scheme, ``ws``/``wss`` read as ``http``/``https``, and its Host header, which must be an
allowed host), or one of ``CSRF_TRUSTED_ORIGINS`` exactly (scheme, host and port: a site behind
a TLS proxy that is not in ``TRUSTED_PROXIES`` sees plain ``ws`` and lists its public origin
there, as Django's CSRF check already needs).
"""

from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for header, value in scope.get("headers", []):
        if header == name:
            return bytes(value).decode("latin1")
    return None


def _origin(parsed: ParseResult) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of an http(s) origin, the port filled in from the scheme."""
    try:
        port = parsed.port
    except ValueError:  # A port that is not a number, or out of range.
        return None
    if parsed.scheme not in DEFAULT_PORTS or not parsed.hostname:
        return None
    return parsed.scheme, parsed.hostname, port or DEFAULT_PORTS[parsed.scheme]


def same_origin_allowed(origin: str | None, host: str | None, scheme: str) -> bool:
    """Whether a socket request to ``scheme://host`` (``ws``/``wss``) may come from ``origin``."""
    if not origin:
        return False
    claimed = _origin(urlparse(origin.strip().lower()))
    if claimed is None:
        return False
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        if _origin(urlparse(trusted.lower())) == claimed:
            return True
    if not host:
        return False
    domain, _ = split_domain_port(host.lower())
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    page_scheme = "https" if scheme in ("wss", "https") else "http"
    return _origin(urlparse(f"{page_scheme}://{host.lower()}")) == claimed


class SameOriginValidator:
    """ASGI middleware: a websocket only from the site's own origin (see the module docstring);
    any other is denied before the application sees it."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator is for websocket connections only.")
        if same_origin_allowed(_header(scope, b"origin"), _header(scope, b"host"), scope.get("scheme", "ws")):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
