"""The client address a request's limits are counted under: REMOTE_ADDR, which the ASGI
application has already set from a trusted proxy's X-Forwarded-For where there is one
(``arena_site.asgi.build_application``). Nothing reads the forwarding headers again."""

from django.http import HttpRequest

from arena_site.networks import client_network


def client_address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def login_address(request: HttpRequest) -> str | None:
    """For django-axes, which counts failed logins and locks out per this value and stores it
    in an address field: the first address of the client's network (its /24 or /64, as every
    per-client limit counts), so that a lockout holds for the neighbouring addresses too. None
    where a request has none (a login made in code, as the test client's force_login does)."""
    address = request.META.get("REMOTE_ADDR")
    if not address:
        return None
    network = client_network(address)
    return network.split("/", 1)[0] if network else address
