"""Prometheus exposition: ``/metrics`` of the web tier, and a port of its own in each worker.

The web tier answers ``/metrics`` (arena_site.health routes it, before the Host check and the
HTTPS redirect, as Prometheus scrapes by address) to clients in ``ARENA_METRICS_ALLOWED`` that
ask directly: a request relayed by a proxy is refused whatever its peer, so that a reverse proxy
on a private address does not open it to the internet. It holds django-prometheus's request
metrics and the arena's own (inference.metrics, votes.metrics, leaderboard.services); in the
embedded arena, whose engines run in the web process, the engines' too.

Celery workers (the default queue's, and the inference hosts of ``manage.py run_inference_host``)
have no web server: with ``ARENA_METRICS_PORT`` set, each serves its own registry on that port
(prometheus_client's server) from its start (Celery's worker_init). A prefork pool's processes
each count their own: with ``PROMETHEUS_MULTIPROC_DIR`` set they write their values there and the
port serves their sum (prometheus_client's multiprocess mode). The directory must exist, and be
empty, when the worker starts (compose.yaml mounts a fresh tmpfs there): files left by an earlier
run would be added to this one's.

Series labelled by model (tokens generated, replies, engines' slots) are served only to a scraper
that sends ``Authorization: Bearer <ARENA_METRICS_TOKEN>``: their deltas across one battle name
its two anonymous models. Without the token (and always while the setting is empty) /metrics
serves every other series, and each withheld family keeps its HELP line, saying so. A worker's
port (``ARENA_METRICS_PORT``, off by default) serves everything, without access control.
"""

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import start_http_server
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from inference import metrics as inference_metrics
from votes import metrics as votes_metrics  # noqa: F401  (registers the replies' counters)

PATH = "/metrics"
WITHHELD_LABEL = "model"
WITHHELD_NOTE = " [Per-model series withheld: they are served with the bearer token ARENA_METRICS_TOKEN.]"
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")

logger = logging.getLogger(__name__)


def allowed(request: HttpRequest) -> bool:
    if any(header in request.META for header in PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(
        address in network
        for network in (ipaddress.ip_network(entry, strict=False) for entry in settings.ARENA_METRICS_ALLOWED)
    )


def has_token(request: HttpRequest) -> bool:
    """The request sends ``Authorization: Bearer <ARENA_METRICS_TOKEN>`` (compared in constant
    time); never while the setting is empty."""
    token = settings.ARENA_METRICS_TOKEN
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(sent.strip().encode(), token.encode())


class WithoutModelSeries:
    """A registry's families without their samples labelled by model: a withheld family keeps its
    name, type and HELP (which says why it is empty)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = [sample for sample in family.samples if WITHHELD_LABEL not in sample.labels]
            if len(kept) == len(family.samples):
                yield family
                continue
            withheld = Metric(family.name, family.documentation + WITHHELD_NOTE, family.type, family.unit)
            withheld.samples = kept
            yield withheld


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponse("forbidden", status=403, content_type="text/plain")
    # The format the scraper asks for (Accept), as prometheus_client's own server chooses it:
    # Prometheus's text format by default, OpenMetrics to a scraper that prefers it.
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    registry = inference_metrics.registry()
    response = HttpResponse(
        encoder(registry if has_token(request) else WithoutModelSeries(registry)), content_type=content_type
    )
    response["Cache-Control"] = "no-store"
    return response


def serve_worker_metrics(**kwargs: Any) -> None:
    """Celery's worker_init: serve this worker's metrics on ARENA_METRICS_PORT, if set."""
    port = settings.ARENA_METRICS_PORT
    if not port:
        return
    start_http_server(port, addr=settings.ARENA_METRICS_ADDRESS, registry=inference_metrics.registry())
    logger.info("Metrics on http://%s:%s/metrics", settings.ARENA_METRICS_ADDRESS, port)


def pool_process_exited(**kwargs: Any) -> None:
    """Celery's worker_process_shutdown: a prefork pool process's live gauges stop counting."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
