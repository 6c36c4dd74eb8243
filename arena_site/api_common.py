"""What every router of the research API shares (``arena_site.api`` mounts them): the error
schema, the researcher key and the throttles.

The key: header ``X-API-Key`` (issued in the admin), read by ninja's ``APIKeyHeader``, so its
scheme is in the OpenAPI document. An operation takes a key or none (``KEY_OR_ANONYMOUS``, the
API's default: without a key ``request.auth`` is ``ANONYMOUS``) or needs one (``KEY_REQUIRED``).

The throttles: ninja's throttle classes, counted in the cache (Redis in production, so every web
process shares them) over a sliding window, per client address without a key
(``ARENA_API_ANON_PER_MINUTE``) and per key with one (``ARENA_API_KEY_PER_MINUTE``). A request
that gets no further than the key (none where one is needed, an unknown or a revoked one) spends
its address's budget before it is refused, so keys cannot be guessed at full speed.
"""

import threading
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja import Schema
from ninja.errors import HttpError, Throttled
from ninja.security import APIKeyHeader
from ninja.throttling import SimpleRateThrottle

from arena_site.addresses import client_address
from votes import services
from votes.models import ResearcherKey
from votes.rate_limits import keyed_hash, network_of, spend


class Error(Schema):
    detail: str


ERRORS: dict[int, Any] = {401: Error, 403: Error, 422: Error, 429: Error}

KEY_HEADER = "X-API-Key"


# --- Throttles -------------------------------------------------------------------------------------


class SlidingWindowThrottle(SimpleRateThrottle):
    """ninja's SimpleRateThrottle counted as the arena's other limits are
    (``votes.rate_limits.spend``): an atomic count per minute, the previous minute weighing as
    much as it still overlaps the last 60 s, so a burst across a minute's end does not pass twice
    the budget. (ninja's own keeps a list of times that it reads and writes back: requests that
    arrive together, in several web processes, each write their own list and all but one go
    uncounted.) The budget is read from ``setting`` at each request."""

    setting: str
    cache_format = "api-throttle:%(scope)s:%(ident)s"  # tests/conftest.py clears api-throttle:*

    def __init__(self) -> None:  # The rate is not fixed at start: see get_rate.
        self._last = threading.local()  # One instance serves every request: the wait is per thread.

    def get_rate(self) -> str:
        return f"{getattr(settings, self.setting)}/min"

    def allow_request(self, request: HttpRequest) -> bool:
        key = self.get_cache_key(request)
        self._last.wait = None
        if key is None:
            return True
        budget, seconds = self.parse_rate(self.get_rate())
        self._last.wait = spend(key, budget or 0, seconds or 60, self.timer())
        return self._last.wait is None

    def wait(self) -> float | None:
        """Seconds until the refused client may send one more (the Retry-After header)."""
        return getattr(self._last, "wait", None)


class AddressThrottle(SlidingWindowThrottle):
    """Requests without a valid key, per client network (the /24 or /64, as every per-client
    limit counts) of the address the ASGI application took from a trusted proxy's
    X-Forwarded-For, or the peer's (``arena_site.addresses``), never a forwarding header read
    again here. Counted under a keyed hash of the network, not the address."""

    scope = "network"
    setting = "ARENA_API_ANON_PER_MINUTE"

    def get_ident(self, request: HttpRequest) -> str:
        return keyed_hash("network", network_of(client_address(request)))

    def get_cache_key(self, request: HttpRequest) -> str | None:
        if isinstance(getattr(request, "auth", None), ResearcherKey):
            return None  # A key spends its own budget.
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class KeyThrottle(SlidingWindowThrottle):
    """Requests with a valid researcher key, per key."""

    scope = "key"
    setting = "ARENA_API_KEY_PER_MINUTE"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        key = getattr(request, "auth", None)
        if not isinstance(key, ResearcherKey):
            return None
        return self.cache_format % {"scope": self.scope, "ident": key.pk}


ADDRESS_THROTTLE = AddressThrottle()
THROTTLES = [ADDRESS_THROTTLE, KeyThrottle()]


def per_minute(request: HttpRequest) -> int:
    """The budget a throttled request was over."""
    if isinstance(getattr(request, "auth", None), ResearcherKey):
        return settings.ARENA_API_KEY_PER_MINUTE
    return settings.ARENA_API_ANON_PER_MINUTE


def _spend_address_budget(request: HttpRequest) -> None:
    if not ADDRESS_THROTTLE.allow_request(request):
        raise Throttled(wait=ADDRESS_THROTTLE.wait())  # type: ignore[arg-type]


# --- The key -------------------------------------------------------------------------------------


class ResearcherKeyHeader(APIKeyHeader):
    """A researcher key in the X-API-Key header; ``required``: a request without one is refused
    (401), else it goes on to the next authentication (``anonymous``)."""

    param_name = KEY_HEADER
    openapi_description = (
        "A researcher API key, issued in the admin (Research API keys). Without one: the leaderboard, "
        "models, tasks, evaluations, dump list and a sample of the newest votes, throttled per client."
    )

    def __init__(self, *, required: bool) -> None:
        self.required = required
        super().__init__()

    def authenticate(self, request: HttpRequest, key: str | None) -> ResearcherKey | None:
        if key is None:
            if not self.required:
                return None
            _spend_address_budget(request)
            raise HttpError(401, f"This needs a researcher API key (header {KEY_HEADER}); ask an admin for one.")
        found = services.researcher_key_for(key)
        if found is None or found.revoked:
            # Guessing keys, or hammering with a revoked one, spends the address's anonymous budget.
            _spend_address_budget(request)
        if found is None:
            raise HttpError(401, "Unknown API key.")
        if found.revoked:
            raise HttpError(403, "This API key has been revoked.")
        return found


class Anonymous:
    """``request.auth`` of a request without a key (ninja takes a falsy result as a refusal)."""

    def __repr__(self) -> str:
        return "ANONYMOUS"


ANONYMOUS = Anonymous()


def anonymous(request: HttpRequest) -> Anonymous:
    """The authentication after the key's where a key is optional: anyone (throttled per address)."""
    return ANONYMOUS


KEY_OR_ANONYMOUS = [ResearcherKeyHeader(required=False), anonymous]
KEY_REQUIRED = [ResearcherKeyHeader(required=True)]


def researcher_key(request: HttpRequest) -> ResearcherKey | None:
    """The request's researcher key, or None for an anonymous request."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ResearcherKey) else None
