"""The research API's docs work offline: Swagger UI at /api/v1/docs loads only the project's own
files (django-ninja's bundled copies, served as static files), and renders the schema in
chromium with every request beyond the server cut off (and, as every chromium test, no
Content-Security-Policy violation: tests/conftest.py).
The old ReDoc address leads there."""

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from playwright.sync_api import Browser, Route, expect


@pytest.mark.django_db
def test_docs_load_only_the_projects_own_files(client: Client) -> None:
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.content.decode())
    assert any(asset.endswith(".js") for asset in assets)  # the UI itself
    for asset in assets:
        assert not urlsplit(asset).netloc, f"the docs load {asset} from another site"
        assert client.get(asset).status_code == 200, asset


@pytest.mark.django_db
def test_schema_has_no_duplicate_keys(client: Client) -> None:
    # Python's json keeps the last of two equal keys; the docs' YAML parsers refuse the schema.
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys among {keys}"
        return dict(pairs)

    json.loads(client.get("/api/v1/openapi.json").content, object_pairs_hook=unique)


@pytest.mark.django_db
def test_the_schema_carries_the_key_scheme(client: Client) -> None:
    """ninja's APIKeyHeader puts the researcher key in the document: the operations that need one
    require it, the others take it or none (an empty requirement), and a 429 names Retry-After."""
    schema = client.get("/api/v1/openapi.json").json()
    (scheme,) = schema["components"]["securitySchemes"].values()
    assert {key: scheme[key] for key in ("type", "in", "name")} == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
    }
    (name,) = schema["components"]["securitySchemes"]
    operations = {path: methods["get"] for path, methods in schema["paths"].items()}
    keyed = {path for path, operation in operations.items() if operation["security"] == [{name: []}]}
    assert keyed == {"/api/v1/episodes", "/api/v1/battles", "/api/v1/battles/{battle_id}", "/api/v1/dumps/{day}/{name}"}
    for path, operation in operations.items():
        assert path in keyed or operation["security"] == [{name: []}, {}], path
        assert "Retry-After" in operation["responses"]["429"]["headers"], path


@pytest.mark.django_db
def test_the_old_redoc_address_leads_to_the_docs(client: Client) -> None:
    response = client.get("/api/v1/redoc")
    assert (response.status_code, response["Location"]) == (301, "/api/v1/docs")


def test_docs_render_the_schema_offline(live_server: object, browser: Browser) -> None:
    server = urlsplit(str(live_server)).hostname
    refused: list[str] = []

    def offline(route: Route) -> None:
        if urlsplit(route.request.url).hostname == server:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context = browser.new_context()
    try:
        page = context.new_page()
        page.route("**/*", offline)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{live_server}/api/v1/docs")
        operations = page.locator(".opblock")  # Swagger UI: one block per operation
        expect(operations.first).to_be_visible(timeout=30_000)
        assert operations.count() >= 5
        page.wait_for_load_state("networkidle")  # what loads late (images) has been asked for
        assert refused == [] and errors == []
    finally:
        context.close()
