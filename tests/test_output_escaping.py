"""Model output is never interpreted as markup: a reply that contains a script stays inert.

The arena page renders every reply in the browser as Markdown through marked, then DOMPurify
(votes/static/votes/markdown.js), and inserts the sanitized nodes, never an HTML string; the
pages rendered on the server (evaluations, admin) go through Django's autoescaping first. The
payloads in a real browser: tests/test_browser.py.
"""

import json
import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from votes import services
from votes.models import Battle, EvaluationReply, EvaluationRun, Message, Task
from votes.templatetags.inert import inert

REPO = Path(__file__).resolve().parents[1]
PAGE_SCRIPTS = [REPO / "votes" / "static" / "votes" / name for name in ("arena.js", "markdown.js", "theme.js")]
BUNDLED_TASKS = REPO / "votes" / "fixtures" / "tasks.json"
SCRIPT = '<script>alert("pwned")</script><img src=x onerror=alert(1)>'
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("script", PAGE_SCRIPTS, ids=lambda path: path.name)
def test_the_pages_scripts_never_insert_markup(script: Path) -> None:
    source = script.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in source, sink


def test_a_script_reply_is_escaped_on_the_evaluation_page(client, demo_llms) -> None:
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    run = EvaluationRun.objects.create(task=Task.objects.get(slug="calendar"), status=EvaluationRun.Status.DONE)
    run.llms.set(demo_llms)
    EvaluationReply.objects.create(
        run=run,
        model=demo_llms[0],
        part=EvaluationReply.Part.RELIABILITY,
        prompt="Add a meeting",
        reply=SCRIPT,
        verdict="garbage",
        reason=SCRIPT,
        rating="garbage",
    )
    # Staff see the texts of models in the arena (anyone else sees them hidden).
    client.force_login(get_user_model().objects.create_user("staff", password="a-long-password-9", is_staff=True))
    html = client.get(f"/evaluations/{run.pk}/").content.decode()
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in html
    assert not re.search(r"<script>\s*alert", html) and "<img src=x" not in html


def test_a_script_reply_is_escaped_in_the_admin(client, demo_llms) -> None:
    battle = services.start_battle(voter_key="voter")
    Message.objects.create(battle=battle, side="a", turn=0, role=Message.Role.USER, content="Hi")
    Message.objects.create(battle=battle, side="a", turn=0, role=Message.Role.ASSISTANT, content=SCRIPT)
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "a-long-password-9")
    client.force_login(admin)
    html = client.get(f"/admin/votes/battle/{Battle.objects.get().pk}/change/").content.decode()
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in html
    assert '<script>alert("pwned")' not in html


ACTING = "".join(map(chr, [*range(0x00, 0xA0), 0x061C, 0x200D, 0x200E, 0x200F, *range(0x2028, 0x2070)]))


def test_acting_characters_are_shown_inert_on_server_pages(client, demo_llms) -> None:
    assert inert("Add \u202eFred\u202c\x07 \t\n ok") == "Add [U+202E]Fred[U+202C][U+0007] \t\n ok"
    battle = services.start_battle(voter_key="voter")
    battle.state, battle.share_id = Battle.State.ENDED, "inert"
    battle.save()
    for side in ("a", "b"):
        Message.objects.create(battle=battle, side=side, turn=0, role=Message.Role.USER, content="Call \u202eFred")
        Message.objects.create(battle=battle, side=side, turn=0, role=Message.Role.ASSISTANT, content="Done.")
    html = client.get("/share/inert/").content.decode()
    assert "Call [U+202E]Fred" in html and "\u202e" not in html


def test_the_browser_shows_the_same_characters_inert(live_server, browser) -> None:
    """markdown.js (prompts and replies in the arena, replies on every page) and the template
    filter agree, character for character."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{live_server}/direct/")
        shown = page.evaluate("(text) => window.ArenaMarkdown.inert(text)", ACTING)
        rendered = page.evaluate("(text) => window.ArenaMarkdown.render(text).textContent", "a\u202eb\x1b[31m")
    finally:
        context.close()
    assert shown == inert(ACTING)
    assert "[U+202E]" in shown and "[U+0000]" in shown and "\u200d" in shown  # a joiner joins emoji: kept
    assert rendered.strip() == "a[U+202E]b[U+001B][31m"
