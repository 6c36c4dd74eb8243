"""The research API's docs work offline: Swagger UI at /api/v1/docs and ReDoc at /api/v1/redoc
load only the project's own files (django-ninja's bundled copies, served as static files), and
render the schema in chromium with every request beyond the server cut off."""

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from playwright.sync_api import Browser, Route, expect

DOCS = ("/api/v1/docs", "/api/v1/redoc")


@pytest.mark.django_db
@pytest.mark.parametrize("path", DOCS)
def test_docs_load_only_the_projects_own_files(client: Client, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.content.decode())
    assert any(asset.endswith(".js") for asset in assets)  # the UI itself
    for asset in assets:
        assert not urlsplit(asset).netloc, f"{path} loads {asset} from another site"
        assert client.get(asset).status_code == 200, asset


@pytest.mark.django_db
def test_schema_has_no_duplicate_keys(client: Client) -> None:
    # Python's json keeps the last of two equal keys; the docs' YAML parsers refuse the schema.
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys among {keys}"
        return dict(pairs)

    json.loads(client.get("/api/v1/openapi.json").content, object_pairs_hook=unique)


@pytest.mark.parametrize(
    ("path", "rendered"),
    [
        ("/api/v1/docs", ".opblock"),  # Swagger UI: one block per operation
        ("/api/v1/redoc", '[data-section-id^="operation/"]'),  # ReDoc: one section per operation
    ],
)
def test_docs_render_the_schema_offline(live_server: object, browser: Browser, path: str, rendered: str) -> None:
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
        page.goto(f"{live_server}{path}")
        expect(page.locator(rendered).first).to_be_visible(timeout=30_000)
        assert page.locator(rendered).count() >= 5
        page.wait_for_load_state("networkidle")  # what loads late (images) has been asked for
        assert refused == [] and errors == []
    finally:
        context.close()
