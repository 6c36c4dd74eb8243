"""Liveness for load balancers and compose: the process answers and reaches its database.

``/healthz`` is answered by the outermost middleware, before Django validates the Host header
and before the HTTPS redirect: a probe comes by address (``127.0.0.1:8000``), not by the site's
name, so with a real ``ALLOWED_HOSTS`` (and ``HTTPS=1``) it would otherwise get a 400 (or a
redirect) from a healthy server. It reveals nothing but "ok". The other probes come the same
way and are answered here too: readiness (``/readyz``, arena_site.readiness) and Prometheus's
scrape (``/metrics``, arena_site.metrics).
"""

from collections.abc import Awaitable, Callable

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse

from arena_site import metrics, readiness
from arena_site.unavailable import OUTAGES, database_unavailable

PATH = "/healthz"


def healthz(request: HttpRequest) -> HttpResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except OUTAGES:
        return database_unavailable(request)
    return HttpResponse("ok", content_type="text/plain")


class HealthCheckMiddleware:
    """Async: a readiness check waiting on a service that does not answer (up to its timeout)
    waits on the event loop, never on the thread every synchronous view of this process shares
    under daphne, and a scrape is rendered on a thread of its own."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in ("GET", "HEAD"):
            if request.path_info == PATH:
                return await sync_to_async(healthz)(request)  # On the thread that owns its connection.
            if request.path_info == readiness.PATH:
                return await readiness.readyz(request)
            if request.path_info == metrics.PATH:
                return await sync_to_async(metrics.metrics_view, thread_sensitive=False)(request)
        return await self.get_response(request)
