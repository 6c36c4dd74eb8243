"""Schemathesis against the research API's OpenAPI schema: every response it generates requests
for is documented (status, content type, body schema) and nothing fails."""

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from leaderboard import services as leaderboard_services
from tests.test_research_api import arena, voter  # noqa: F401  (the fixture, and what it uses)
from votes import services

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())


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
def test_api_conforms_to_its_schema(case, token) -> None:
    # Uncompressed: schemathesis's WSGI transport does not undo the gzip the site sends browsers.
    case.call_and_validate(headers={"X-API-Key": token, "Accept-Encoding": "identity"})
