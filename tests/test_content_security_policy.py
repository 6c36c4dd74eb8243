"""Every response carries a strict Content-Security-Policy (django-csp; arena_site/settings.py),
and the pages keep to it: no inline script, event handler or style attribute, nothing from
another origin.

Every chromium test in the suite fails on a policy violation its pages report (tests/conftest.py
watches the console), so the arena, leaderboard, evaluation, share, named, direct and 404 pages,
the admin task editor and the API docs are checked in the browser where they are tested; this
module adds the admin's other pages, and shows that the watch does catch a violation.
"""

from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import Browser

from tests import conftest
from votes.models import Battle, EvaluationReply, EvaluationRun, Task, Vote

pytestmark = pytest.mark.django_db
ADMIN_PASSWORD = "a-long-test-password"


def policy(response: Any) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return dict(part.strip().split(" ", 1) for part in header.split(";"))


class InlineCode(HTMLParser):
    """What a strict policy refuses in a page: inline scripts, event handlers, style attributes
    and <style> elements. JSON data in a <script type="application/json"> is not code."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        self.found += [f"<{tag} {name}=...>" for name in names if name.startswith("on") or name == "style"]
        if tag == "style":
            self.found.append("<style>")
        self._in_script = tag == "script" and "src" not in names and names.get("type") != "application/json"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append(f"<script>{data.strip()[:40]}")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False


def inline_code(html: str) -> list[str]:
    parser = InlineCode()
    parser.feed(html)
    return parser.found


@pytest.fixture
def site(demo_llms: list[Any]) -> dict[str, str]:
    """One of every page, with what makes it show its parts: an ended battle with a vote (share
    page, heatmaps), an evaluation run with a reply."""
    strong, weak = demo_llms
    battle = Battle.objects.create(model_a=strong, model_b=weak, voter_key="csp", state=Battle.State.ENDED)
    Vote.objects.create(battle=battle, choice="a", stage=Vote.Stage.FIRST_TRY)
    run = EvaluationRun.objects.create(task=Task.objects.create(slug="run", title="Run"), status="done")
    run.llms.set(demo_llms)
    EvaluationReply.objects.create(
        run=run, model=strong, part="reliability", prompt="Add", reply="Done.", verdict="correct", rating="correct"
    )
    return {
        "arena": "/",
        "named": "/named/",
        "direct": "/direct/",
        "leaderboard": "/leaderboard/",
        "evaluations": "/evaluations/",
        "evaluation": f"/evaluations/{run.pk}/",
        "share": f"/share/{battle.public_id}/",
        "not found": "/battle/someone-elses/",
        "api docs": "/api/v1/docs",
        "api": "/api/v1/models",
        "api not found": "/api/v1/nothing-here",
        "admin login": "/admin/login/",
    }


def test_every_response_carries_the_policy(client: Client, site: dict[str, str]) -> None:
    for name, path in site.items():
        directives = policy(client.get(path))
        assert directives["default-src"] == directives["script-src"] == directives["style-src"] == "'self'", name
        assert directives["object-src"] == directives["base-uri"] == directives["frame-ancestors"] == "'none'", name
        assert "unsafe" not in str(directives), name


def test_no_page_holds_inline_code(client: Client, site: dict[str, str]) -> None:
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", ADMIN_PASSWORD)
    pages = {
        name: client.get(path).content.decode() for name, path in site.items() if "api" not in name or "docs" in name
    }
    client.force_login(admin)
    for path in ("/admin/", "/admin/votes/task/", "/admin/votes/task/add/", "/admin/inference/llm/add/"):
        pages[path] = client.get(path).content.decode()
    assert {name: found for name, found in ((name, inline_code(html)) for name, html in pages.items()) if found} == {}


def test_the_inline_code_check_sees_inline_code() -> None:
    assert inline_code('<p style="color: red" onclick="go()">x</p><script>go()</script><style>p{}</style>') == [
        "<p style=...>",
        "<p onclick=...>",
        "<script>go()",
        "<style>",
    ]
    assert inline_code('<script src="/a.js"></script><script type="application/json">{"a": 1}</script>') == []


@pytest.mark.django_db(transaction=True)
def test_the_admin_keeps_to_the_policy_in_chromium(live_server: Any, browser: Browser, demo_llms: list[Any]) -> None:
    get_user_model().objects.create_superuser("admin", "admin@example.com", ADMIN_PASSWORD)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{live_server}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", ADMIN_PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server}/admin/")
        for path in ("votes/task/", "votes/task/add/", "inference/llm/", "inference/llm/add/", "votes/battle/"):
            page.goto(f"{live_server}/admin/{path}", wait_until="networkidle")
        assert conftest.POLICY_VIOLATIONS == []  # the watch's own check runs after this test, too

        # The watch sees a violation: a script element added to the page is refused and reported.
        page.evaluate("document.body.append(Object.assign(document.createElement('script'), {text: 'void 0'}))")
        page.wait_for_function("true")
        page.goto(f"{live_server}/admin/")  # the report has reached the console by the next page
        assert any("script-src" in violation for violation in conftest.POLICY_VIOLATIONS)
        conftest.POLICY_VIOLATIONS.clear()
    finally:
        context.close()
