"""The client address a request's limits are counted under: REMOTE_ADDR, which the ASGI
application has already set from a trusted proxy's X-Forwarded-For where there is one
(``arena_site.asgi.build_application``). Nothing reads the forwarding headers again."""

from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def login_address(request: HttpRequest) -> str | None:
    """For django-axes, which stores it in an address field: None where a request has none (a
    login made in code, as the test client's force_login does)."""
    return request.META.get("REMOTE_ADDR") or None
