"""Readiness for load balancers: can this web process serve battles now? (``/readyz``)

Liveness (``/healthz``, arena_site.health) asks whether the process answers and reaches its
database; readiness asks whether everything a battle needs is reachable: the database, the cache
(rate limits and throttles), Redis (the channel layer that carries every frame) and the Celery
broker (the replies' jobs). A balancer takes a process out of rotation while it answers 503, and
the JSON names what failed.

The checks are django-health-check's (its Database, Cache and Redis), run concurrently with its
timeouts, plus a broker check of its kind: the library's Celery check pings workers, which is a
question about workers (each has its own probe in compose.yaml), not about whether this process
can queue a job. Its view is not used: it answers 500 rather than 503, names each check by its
repr (Redis's includes the server's host and port), and, as a URL view, would meet the Host
check and HTTPS redirect a probe by address must not (arena_site.health answers first).
"""

import asyncio
import dataclasses
import datetime

import redis.asyncio
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from health_check.base import HealthCheck
from health_check.checks import Cache, Database
from health_check.contrib.redis import Redis
from health_check.exceptions import ServiceUnavailable
from kombu import Connection

PATH = "/readyz"


@dataclasses.dataclass
class Broker(HealthCheck):
    """A connection to the Celery broker opens (the URL is the setting's at each check)."""

    timeout: datetime.timedelta = dataclasses.field(default=datetime.timedelta(seconds=3), repr=False)

    def run(self) -> None:
        try:
            with Connection(settings.CELERY_BROKER_URL, connect_timeout=self.timeout.total_seconds()) as connection:
                connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
                connection.default_channel  # noqa: B018  # Opens the transport's channel (Redis: a PING).
        except Exception as exc:
            raise ServiceUnavailable("Unable to connect to the broker") from exc


def checks() -> dict[str, HealthCheck]:
    """The checks by the name the answer gives them; Redis and the broker only where there
    are some (the embedded arena has neither: in-memory channel layer, in-process worker)."""
    timeout = datetime.timedelta(seconds=settings.ARENA_READINESS_TIMEOUT_SECONDS)
    found: dict[str, HealthCheck] = {"database": Database(), "cache": Cache()}
    if settings.REDIS_URL:
        url, seconds = settings.REDIS_URL, timeout.total_seconds()
        found["redis"] = Redis(
            client_factory=lambda: redis.asyncio.Redis.from_url(
                url, socket_connect_timeout=seconds, socket_timeout=seconds
            )
        )
    if settings.GENERATION_BACKEND == "celery":
        found["broker"] = Broker(timeout=timeout)
    for check in found.values():
        check.timeout = timeout  # The library's own limit on each (its default: 5 s).
    return found


async def readyz(request: HttpRequest) -> JsonResponse:
    named = checks()
    results = await asyncio.gather(*(check.get_result() for check in named.values()))
    failed = {name: str(result.error) for name, result in zip(named, results, strict=True) if result.error}
    response = JsonResponse(
        {"status": "unavailable" if failed else "ok", "checks": {name: failed.get(name, "ok") for name in named}},
        status=503 if failed else 200,
    )
    response["Cache-Control"] = "no-store"
    return response
