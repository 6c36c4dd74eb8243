"""/readyz: 200 while the database, the cache, Redis and the broker all answer; 503 naming the
one that does not (a real closed port, not a mock of the check). That it is answered by address,
before the Host check and the HTTPS redirect, as a load balancer's probe comes, is tested with
compose's own probe (tests/test_compose.py)."""

import json
from typing import Any

import pytest
from django.test import Client

from tests.test_database_outage import database_down
from votes.testing.stack import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def readyz(**extra: Any) -> tuple[int, dict[str, Any]]:
    response = Client().get("/readyz", **extra)
    assert response["Content-Type"] == "application/json"
    return response.status_code, json.loads(response.content)


def test_ready_when_every_service_answers() -> None:
    assert readyz() == (
        200,
        {"status": "ok", "checks": {"database": "ok", "cache": "ok", "redis": "ok", "broker": "ok"}},
    )


def test_a_broker_that_does_not_answer_is_named(settings: Any) -> None:
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    status, body = readyz()
    assert status == 503 and body["status"] == "unavailable"
    assert body["checks"]["broker"] != "ok"
    assert {name: body["checks"][name] for name in ("database", "cache", "redis")} == dict.fromkeys(
        ("database", "cache", "redis"), "ok"
    )


def test_a_redis_that_does_not_answer_is_named(settings: Any) -> None:
    port = free_port()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    status, body = readyz()
    assert status == 503
    assert body["checks"]["redis"].startswith("Unavailable")
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] == "ok"
    assert str(port) not in json.dumps(body)  # The answer gives no address away.


def test_a_database_that_does_not_answer_is_named() -> None:
    with database_down():
        status, body = readyz()
    assert status == 503
    assert body["checks"]["database"] != "ok"
    assert body["checks"]["broker"] == "ok" and body["checks"]["redis"] == "ok"


def test_the_embedded_arena_has_no_redis_or_broker_to_check(embedded_mode: None, settings: Any) -> None:
    settings.REDIS_URL = ""
    assert readyz() == (200, {"status": "ok", "checks": {"database": "ok", "cache": "ok"}})
