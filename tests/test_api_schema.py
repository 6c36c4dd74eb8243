"""Schemathesis against the research API's OpenAPI schema, as `schemathesis run --checks all`
does: positive and negative requests, with a researcher key and without one; every response is
documented (status, content type, headers, body schema), bad input is refused with a 4xx, good
input accepted, and nothing fails."""

import pytest
import schemathesis
import schemathesis.specs.openapi.checks
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS

from leaderboard import services as leaderboard_services
from tests.test_research_api import arena, voter  # noqa: F401  (the fixture, and what it uses)
from votes import services

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
ALL_CHECKS = CHECKS.get_all()


@pytest.fixture
def _keep_test_connection():
    """As Django's test client does: a request must not close the test's database connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def token(arena, settings, _keep_test_connection):  # noqa: F811
    settings.ARENA_API_ANON_PER_MINUTE = 10**6
    settings.ARENA_API_KEY_PER_MINUTE = 10**6
    leaderboard_services.refresh_leaderboard(rounds=20)
    return services.issue_researcher_key("schemathesis")[1]


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema_with_a_key(case, token) -> None:
    # Uncompressed: schemathesis's WSGI transport does not undo the gzip the site sends browsers.
    headers = {"Accept-Encoding": "identity"}
    # The key, except in a negative case that leaves it out on purpose (the schema declares it:
    # a key-only operation must then refuse the request, and the check expects that refusal).
    if not case.operation.schema.is_security_param_negated(case):
        headers["X-API-Key"] = token
    case.call_and_validate(headers=headers, checks=ALL_CHECKS)


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema_without_a_key(case, token) -> None:
    case.call_and_validate(headers={"Accept-Encoding": "identity"}, checks=ALL_CHECKS)
