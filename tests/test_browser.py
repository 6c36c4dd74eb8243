"""A real browser (Debian's chromium, driven by Playwright) against a real stack: daphne and a
Celery worker on loopback. A voter plays a whole battle; a reply no server takes fails clearly
and is retried; the leaderboard and the admin task editor open; the controls are reachable by
keyboard; the page works at phone width.

Screenshots go to ARENA_TEST_ARTIFACTS (default var/test-artifacts/browser/).
"""

import asyncio
import os
import re
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from axe_playwright_python.sync_playwright import Axe
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from inference.models import LLM
from tests.conftest import BATTLE_PRESETS, battle_llm_fields
from votes.models import Battle, EvaluationReply, EvaluationRun, Message, Task, Vote
from votes.selectors import battle_group
from votes.services import NOT_PICKED_UP, voter_key_for
from votes.testing.stack import Stack, database_url
from votes.testing.voters import run_voters

pytestmark = pytest.mark.django_db(transaction=True)

ARTIFACTS = Path(os.environ.get("ARENA_TEST_ARTIFACTS", settings.BASE_DIR / "var" / "test-artifacts")) / "browser"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
QUEUE_PREFIX = f"browser-{uuid.uuid4().hex[:8]}"


def create_models() -> list[LLM]:
    return [
        LLM.objects.update_or_create(name=name, defaults=battle_llm_fields(name, f"{QUEUE_PREFIX}.{name}"))[0]
        for name in BATTLE_PRESETS
    ]


@pytest.fixture(scope="module")
def live_url(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """daphne and an inference worker of their own, on the test database and Redis, warmed up
    by one battle over a websocket (the models load at their first reply), so that both sides
    of the tests' battles stream at once."""
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path_factory.mktemp("browser-stack"),
        # A slow pace, so that both panes are seen streaming (a reply of the tests' models, about
        # 100 characters, streams for 5 s). A short hold: a side whose other side no worker
        # takes (the retry test) waits 3 s for it, not the default 20.
        env={
            "ARENA_STREAM_CHARS_PER_S": "20",
            "ARENA_STREAM_FIRST_TEXT_SECONDS": "0.2",
            "ARENA_STREAM_HOLD_SECONDS": "3",
        },
    )
    try:
        stack.start_worker("browser-worker", [f"{QUEUE_PREFIX}.{name}" for name in BATTLE_PRESETS])
        _, url = stack.start_web()
        with django_db_blocker.unblock():
            create_models()  # removed by the first test's flush
        (warm_up,), _ = asyncio.run(run_voters(url, 1))
        assert warm_up.finished, warm_up.errors
        yield url
    finally:
        stack.stop()


@pytest.fixture
def models(db: None) -> list[LLM]:
    return create_models()


def open_page(browser: Browser, viewport: dict[str, int]) -> Iterator[Page]:
    """A page in a context of its own (a voter), failing the test on any JavaScript error."""
    phone = viewport == PHONE
    context = browser.new_context(viewport=viewport, is_mobile=phone, has_touch=phone)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    wait_for_disconnects()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    yield from open_page(browser, DESKTOP)


@pytest.fixture(params=["desktop", "phone"])
def sized_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """The same test at desktop and at phone width."""
    yield from open_page(browser, PHONE if request.param == "phone" else DESKTOP)


def wait_for_disconnects(timeout_s: float = 30.0) -> None:
    """Return once daphne has handled the closed page's websocket disconnects. A consumer that
    disconnects stops its battle's replies in a transaction, then leaves the battle's group
    (votes.consumers); were that transaction still running, it could deadlock with the flush
    that ends this test (a TRUNCATE of every table). The test's battles' groups empty: done."""
    layer = get_channel_layer()
    battles = Battle.objects.values_list("public_id", flat=True)
    keys = [layer._group_key(battle_group(public_id)) for public_id in battles]
    client = redis.Redis.from_url(settings.REDIS_URL)
    deadline = time.monotonic() + timeout_s
    try:
        while keys and client.exists(*keys):
            assert time.monotonic() < deadline, f"daphne did not handle a websocket disconnect in {timeout_s} s"
            time.sleep(0.05)
    finally:
        client.close()


def shot(page: Page, name: str) -> None:
    """A full-page screenshot; at phone width its name says so."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    suffix = "-phone" if size is not None and size["width"] == PHONE["width"] and "phone" not in name else ""
    page.screenshot(path=str(ARTIFACTS / f"{name}{suffix}.png"), full_page=True)


def reply(page: Page, side: str, index: int = -1) -> Any:
    return page.locator(f"#log-{side} .msg.assistant").nth(index)


def wait_finished(page: Page, side: str, count: int) -> None:
    """The side's count-th reply is finished: a finished reply gets its rating buttons."""
    expect(page.locator(f"#log-{side} .msg.assistant .ratings")).to_have_count(count, timeout=120_000)


# Marks a side as streamed once its pane shows text while that side's reply is unfinished (its
# Stop button is shown only then).
WATCH_STREAMING = """() => {
  window.streamed = {a: false, b: false};
  new MutationObserver(() => {
    for (const side of ['a', 'b']) {
      const text = document.querySelector('#log-' + side + ' .msg.assistant .text');
      const stop = document.querySelector('.stop-side[data-side="' + side + '"]');
      if (text && text.textContent.length > 0 && !stop.hidden) { window.streamed[side] = true; }
    }
  }).observe(document.getElementById('arena'), {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def test_a_voter_plays_a_whole_battle(live_url: str, models: list[LLM], sized_page: Page) -> None:
    page = sized_page
    page.goto(live_url + "/")
    expect(page.locator("#send")).to_be_enabled()
    shot(page, "01-arena")
    page.evaluate(WATCH_STREAMING)
    page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
    page.keyboard.press("Enter")

    # Both panes stream: each shows part of its reply while the reply is still being written.
    page.wait_for_function("() => window.streamed.a && window.streamed.b", timeout=120_000)
    shot(page, "02-streaming")
    wait_finished(page, "a", 1)
    wait_finished(page, "b", 1)
    assert page.url.startswith(live_url + "/battle/")
    public_id = page.url.rstrip("/").rsplit("/", 1)[1]
    # 🥦 answers a mistake: a first reply does not offer it.
    expect(reply(page, "a").locator('button[data-rating="fixed"]')).to_be_hidden()

    # A correction sent with Enter before the first vote is refused, with the reason, and stays
    # in the box; the error clears once the voter does something the server accepts.
    page.fill("#prompt", "It is at 6PM, not 5PM.")
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_contain_text("before going on")
    expect(page.locator("#status")).to_have_class(re.compile("error"))
    expect(page.locator("#prompt")).to_have_value("It is at 6PM, not 5PM.")
    reply(page, "a").get_by_title("Rate this reply: correct").click()
    expect(page.locator("#status")).not_to_have_class(re.compile("error"))
    expect(page.locator("#status")).to_have_text("")
    reply(page, "b").get_by_role("button", name="Mistake").click()
    expect(reply(page, "b").locator("button.chosen")).to_have_text("🍄")
    # Rating B's reply a mistake aims the input at B: it says so, and A says it waits.
    expect(page.locator("#target")).to_have_text("To B only — A waits")
    expect(page.locator("#send")).to_have_text("Send to B only")
    expect(page.locator('.paused-note[data-side="a"]')).to_have_text("Waiting: your next message goes to B only.")
    # Rating buttons have text names, say which is chosen, and are targets of at least 24 px.
    expect(reply(page, "b").get_by_role("button", name="Mistake")).to_have_attribute("aria-pressed", "true")
    expect(reply(page, "b").get_by_role("button", name="Correct")).to_have_attribute("aria-pressed", "false")
    box = reply(page, "b").get_by_role("button", name="Garbage").bounding_box()
    assert box is not None and box["width"] >= 24 and box["height"] >= 24
    page.get_by_role("button", name="A is better").click()
    expect(page.locator("#vote-stage")).to_contain_text("Correct a side")
    expect(page.locator("#your-votes")).to_have_text("Your votes — first try: A is better.")

    # The refused correction, still in the box, goes to side B only: A stays paused with its
    # single turn, and the box empties once the server took it.
    text_a = reply(page, "a").locator(".text").get_attribute("data-source")
    expect(page.locator("#prompt")).to_have_value("It is at 6PM, not 5PM.")
    page.get_by_role("button", name="Send to B only").click()
    expect(page.locator("#prompt")).to_have_value("")
    wait_finished(page, "b", 2)
    expect(page.locator("#log-a .msg.user")).to_have_count(1)
    expect(page.locator("#log-b .msg.user")).to_have_count(2)
    assert reply(page, "a").locator(".text").get_attribute("data-source") == text_a
    expect(page.locator('.paused-note[data-side="a"]')).to_contain_text("went to B only")
    reply(page, "b").get_by_title("Rate this reply: fixed after a correction").click()
    expect(reply(page, "b").locator("button.chosen")).to_have_text("🥦")
    shot(page, "03-corrected")

    page.get_by_role("button", name="B is better").click()
    expect(page.locator("#vote-stage")).to_contain_text("End the battle")
    page.get_by_role("button", name="End battle and reveal").click()
    votes_cast = "Your votes — first try: A is better; after the fix: B is better."
    expect(page.locator("#your-votes")).to_have_text(votes_cast)
    # After the reveal the ratings stay as a record, and no control is offered.
    expect(reply(page, "b", 0).locator('button[data-rating="mistake"]')).to_be_disabled()
    for rating in ("correct", "fixed", "garbage"):
        expect(reply(page, "b", 0).locator(f'button[data-rating="{rating}"]')).to_be_hidden()
    for control in ("#prompt", "#send", "#end", "#votes button[data-choice]", ".regenerate"):
        expect(page.locator(control).first).to_be_hidden()
    names = {m.name for m in models}
    for side in "ab":
        heading = page.locator(f'.pane[data-side="{side}"] h2')
        expect(heading).to_contain_text(f"Model {side.upper()}: ")
        assert heading.text_content().split(": ", 1)[1] in names
    shot(page, "04-revealed")

    battle = Battle.objects.get(public_id=public_id)
    assert battle.state == Battle.State.ENDED
    assert dict(Vote.objects.filter(battle=battle).values_list("stage", "choice")) == {
        "first_try": "a",
        "after_fix": "b",
    }
    ratings = dict(Message.objects.filter(battle=battle, role="assistant", side="b").values_list("turn", "rating"))
    assert ratings == {0: "mistake", 1: "fixed"}
    assert Message.objects.get(battle=battle, side="a", turn=0, role="assistant").rating == "correct"
    assert not Message.objects.filter(battle=battle, side="a", turn=1).exists()


def test_a_reply_no_server_takes_fails_clearly_and_can_be_retried(live_url: str, models: list[LLM], page: Page) -> None:
    served, unserved = models
    unserved.queue = f"{QUEUE_PREFIX}.nobody"  # no worker consumes it: its replies wait forever
    unserved.save()
    page.goto(live_url + "/")
    expect(page.locator("#send")).to_be_enabled()
    page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/battle/[\w-]+/$"))
    battle = Battle.objects.get(public_id=page.url.rstrip("/").rsplit("/", 1)[1])
    lost = "a" if battle.model_a_id == unserved.pk else "b"
    wait_finished(page, "b" if lost == "a" else "a", 1)

    # As if the reply had waited ARENA_REPLY_QUEUE_SECONDS: the page, quiet for 10 s with a reply
    # unfinished, asks for a sync, and the server fails the reply rather than let it spin.
    Message.objects.filter(battle=battle, side=lost, role="assistant").update(
        heartbeat=timezone.now() - timedelta(hours=1)
    )
    expect(reply(page, lost).get_by_role("alert")).to_have_text(NOT_PICKED_UP, timeout=30_000)
    retry = reply(page, lost).get_by_role("button", name="Retry")
    expect(retry).to_be_visible()
    expect(reply(page, lost).locator(".ratings")).to_have_count(0)
    shot(page, "10-reply-failed")

    unserved.queue = served.queue  # a model server for it again
    unserved.save()
    retry.click()
    wait_finished(page, lost, 1)
    expect(reply(page, lost).get_by_role("button", name="Retry")).to_have_count(0)
    retried = Message.objects.get(battle=battle, side=lost, role="assistant")
    assert retried.status == Message.Status.DONE and retried.content
    assert retried.regenerations == 1
    assert reply(page, lost).locator(".text").get_attribute("data-source") == retried.content
    shot(page, "11-reply-retried")


FOCUSED = "() => { const e = document.activeElement; return e.title || e.textContent.trim() || e.id; }"


def focus_order(page: Page, presses: int = 40) -> list[str]:
    """What Tab reaches, in order: each focused element's title, text or id."""
    reached = []
    for _ in range(presses):
        page.keyboard.press("Tab")
        reached.append(page.evaluate(FOCUSED))
    return reached


def test_controls_are_reachable_and_usable_by_keyboard(live_url: str, models: list[LLM], page: Page) -> None:
    page.goto(live_url + "/")
    expect(page.locator("#send")).to_be_enabled()
    page.focus("#prompt")
    page.keyboard.type("Add a meeting with Fred on Nov 11 at 5PM")
    page.keyboard.press("Enter")
    wait_finished(page, "a", 1)
    wait_finished(page, "b", 1)

    reached = focus_order(page)
    for control in [
        "prompt",
        "A is better",
        "Tie",
        "Both are bad",
        "Rate this reply: correct",
        "Rate this reply: a mistake",
        "Rate this reply: garbage",
        "Regenerate",
        "Leaderboard",
    ]:
        assert control in reached, f"{control!r} is not reachable with Tab: {reached}"

    # Rating and voting with the keyboard alone: Tab to the control, press Enter or Space.
    page.focus(".brand")  # from the top of the page: A's pane comes before B's
    tab_to(page, "Rate this reply: a mistake")
    page.keyboard.press("Space")
    expect(page.locator("button.chosen")).to_have_count(1)
    tab_to(page, "Tie")
    page.keyboard.press("Enter")
    expect(page.locator("#vote-stage")).to_contain_text("Correct a side")
    public_id = battle_id(page)
    assert Vote.objects.get(battle__public_id=public_id).choice == "tie"
    assert Message.objects.filter(battle__public_id=public_id, rating="mistake").count() == 1

    # The reply rated a mistake aimed the input at its side: Enter sends the correction there.
    expect(page.locator("#target")).to_have_text("To A only — B waits")
    reached = focus_order(page)
    for control in ["Send to A only", "Send to both instead", "Only to A", "Only to B", "End battle and reveal"]:
        assert control in reached, f"{control!r} is not reachable with Tab: {reached}"
    page.focus("#prompt")
    page.keyboard.type("It is at 6PM, not 5PM.")
    page.keyboard.press("Enter")
    wait_finished(page, "a", 2)
    expect(page.locator("#log-b .msg.user")).to_have_count(1)
    expect(page.locator('.paused-note[data-side="b"]')).to_contain_text("went to A only")
    shot(page, "05-keyboard")


def tab_to(page: Page, control: str, presses: int = 80) -> None:
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate(FOCUSED) == control:
            return
    raise AssertionError(f"{control!r} is not reachable with Tab")


def test_the_arena_works_at_phone_width(live_url: str, models: list[LLM], browser: Browser) -> None:
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(live_url + "/")
        page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
        page.locator("#send").tap()
        wait_finished(page, "a", 1)
        wait_finished(page, "b", 1)
        # Nothing wider than the screen; the panes stack, both visible in turn.
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        box_a = page.locator('.pane[data-side="a"]').bounding_box()
        box_b = page.locator('.pane[data-side="b"]').bounding_box()
        assert box_a and box_b and box_b["y"] >= box_a["y"] + box_a["height"]
        assert box_a["width"] <= PHONE["width"]
        page.get_by_role("button", name="Both are bad").tap()
        expect(page.locator("#vote-stage")).to_contain_text("Correct a side")
        shot(page, "06-phone")
        # An ended battle with a vote, so that the board has rows: on a phone each row shows its
        # rank, model and rating, and the other columns one tap away.
        strong, weak = models
        ended = Battle.objects.create(model_a=strong, model_b=weak, voter_key="phone", state=Battle.State.ENDED)
        Vote.objects.create(battle=ended, choice="a", stage=Vote.Stage.FIRST_TRY)
        page.goto(live_url + "/leaderboard/")
        expect(page.get_by_role("heading", name="Leaderboard")).to_be_visible()
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        expect(page.get_by_role("columnheader", name="Rating", exact=True)).to_be_visible()
        expect(page.get_by_role("columnheader", name="95% interval")).to_be_hidden()
        first_row = page.locator("table.leaderboard tbody tr").first
        expect(first_row.get_by_text("Votes", exact=True)).to_be_hidden()
        first_row.get_by_text("More").tap()
        expect(first_row.get_by_text("Votes", exact=True)).to_be_visible()
        shot(page, "07-phone-leaderboard")
    finally:
        context.close()


def test_the_leaderboard_opens(live_url: str, models: list[LLM], page: Page) -> None:
    page.goto(live_url + "/leaderboard/")
    expect(page.get_by_role("heading", name="Leaderboard", exact=True)).to_be_visible()
    shot(page, "08-leaderboard")


def test_an_admin_edits_a_task(live_url: str, models: list[LLM], page: Page) -> None:
    get_user_model().objects.create_superuser("admin", "admin@example.com", "a-long-test-password")
    page.goto(live_url + "/admin/votes/task/add/")
    expect(page).to_have_url(f"{live_url}/admin/login/?next=/admin/votes/task/add/")  # behind login
    page.fill("#id_username", "admin")
    page.fill("#id_password", "a-long-test-password")
    page.get_by_role("button", name="Log in").click()

    page.locator("#id_title").press_sequentially("Book a room")
    expect(page.locator("#id_slug")).to_have_value("book-a-room")  # filled in from the title
    page.fill("#id_system_prompt", "You book meeting rooms.")
    page.locator("#turns-group .add-row a").click()  # "Add another …" under the turns
    page.fill("#id_turns-0-position", "0")
    page.fill("#id_turns-0-prompt", "Book room 4 at noon.")
    page.fill("#id_turns-0-expected_output", "book_room(room=4, time='12:00')")
    shot(page, "09-admin-task-editor")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    task = Task.objects.get(slug="book-a-room")
    assert task.system_prompt == "You book meeting rooms."
    assert list(task.turns.values_list("position", "prompt")) == [(0, "Book room 4 at noon.")]


def battle_id(page: Page) -> str:
    expect(page).to_have_url(re.compile(r"/battle/[\w-]+/$"))
    return page.url.rstrip("/").rsplit("/", 1)[1]


def start_streaming(page: Page, live_url: str) -> str:
    """Send the first prompt and wait until both panes show text of unfinished replies."""
    page.goto(live_url + "/")
    expect(page.locator("#send")).to_be_enabled()
    page.evaluate(WATCH_STREAMING)
    page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.streamed.a && window.streamed.b", timeout=120_000)
    return battle_id(page)


# Records whether A's "Only to A" was ever enabled while B's reply was still being written.
WATCH_ONE_SIDE_OPEN = """() => {
  window.oneSideOpen = false;
  new MutationObserver(() => {
    const toA = document.querySelector('.send-one[data-side="a"]');
    const toB = document.querySelector('.send-one[data-side="b"]');
    const bWrites = !document.querySelector('.stop-side[data-side="b"]').hidden;
    if (!toA.disabled && toB.disabled && bWrites) { window.oneSideOpen = true; }
  }).observe(document.getElementById('arena'), {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def test_a_finished_side_is_corrected_while_the_other_writes(live_url: str, models: list[LLM], page: Page) -> None:
    """Disabled controls say why before they are pressed; a side that is done can be corrected
    at once, while the other still writes."""
    start_streaming(page, live_url)
    why = page.locator("#why")
    expect(why).to_contain_text("Voting opens when both replies are finished")
    tie = page.locator("#votes button[data-choice='tie']")
    expect(tie).to_be_disabled()
    expect(tie).to_have_attribute("title", re.compile("Voting opens when both replies are finished"))
    wait_finished(page, "a", 1)
    wait_finished(page, "b", 1)
    expect(why).to_contain_text("Say which side did better on the first try")
    expect(page.locator("#send")).to_have_attribute("title", re.compile("wait for that vote"))
    tie.click()
    expect(why).to_be_hidden()

    page.evaluate(WATCH_STREAMING)
    page.evaluate(WATCH_ONE_SIDE_OPEN)
    page.fill("#prompt", "And one with Ann on Nov 12 at 9AM")
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.streamed.a && window.streamed.b", timeout=120_000)
    page.click('.stop-side[data-side="a"]')
    page.wait_for_function("() => window.oneSideOpen", timeout=30_000)
    page.fill("#prompt", "It is at 9AM, not 9PM.")
    page.click('.send-one[data-side="a"]')
    expect(page.locator("#log-a .msg.user")).to_have_count(3)
    expect(page.locator("#log-b .msg.user")).to_have_count(2)
    # The correction is answered; once B is done too, nothing waits any more.
    expect(page.locator("#log-a .msg.assistant")).to_have_count(3)
    for side in "ab":
        expect(reply(page, side)).to_have_class(re.compile("is-done|is-stopped"), timeout=120_000)
    expect(why).to_be_hidden()


def test_closing_one_tab_never_stops_what_another_shows(live_url: str, models: list[LLM], sized_page: Page) -> None:
    page = sized_page
    public_id = start_streaming(page, live_url)
    expect(reply(page, "a")).to_have_class(re.compile("is-streaming"))
    expect(reply(page, "a").locator(".reply-status")).to_have_text("Writing…")
    other = page.context.new_page()  # the same voter, a second tab of the same battle
    other.goto(f"{live_url}/battle/{public_id}/")
    expect(other.locator("#log-a .msg.assistant")).to_have_count(1)
    page.close()  # mid-stream

    wait_finished(other, "a", 1)
    wait_finished(other, "b", 1)
    saved = {m.side: m for m in Message.objects.filter(battle__public_id=public_id, role="assistant")}
    assert {m.status for m in saved.values()} == {Message.Status.DONE}
    for side in "ab":
        assert reply(other, side).locator(".text").get_attribute("data-source") == saved[side].content
        expect(reply(other, side)).to_have_class(re.compile("is-done"))
    shot(other, "12-other-tab-finished")


def test_a_reload_mid_stream_resumes_the_reply(live_url: str, models: list[LLM], sized_page: Page) -> None:
    page = sized_page
    public_id = start_streaming(page, live_url)
    page.reload()
    expect(page.locator("#log-a .msg.assistant")).to_have_count(1)
    wait_finished(page, "a", 1)
    wait_finished(page, "b", 1)
    saved = {m.side: m for m in Message.objects.filter(battle__public_id=public_id, role="assistant")}
    assert {m.status for m in saved.values()} == {Message.Status.DONE}
    for side in "ab":
        assert reply(page, side).locator(".text").get_attribute("data-source") == saved[side].content


def test_a_battle_left_after_its_vote_ends_and_its_vote_counts(
    live_url: str, models: list[LLM], sized_page: Page
) -> None:
    page = sized_page
    page.goto(live_url + "/")
    page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
    page.keyboard.press("Enter")
    public_id = battle_id(page)
    wait_finished(page, "a", 1)
    wait_finished(page, "b", 1)
    page.get_by_role("button", name="B is better").click()
    expect(page.locator("#your-votes")).to_have_text("Your votes — first try: B is better.")
    page.goto(live_url + "/evaluations/")  # the voter goes elsewhere without ending the battle
    # The page's leaving is handled (its disconnect writes the battle's row; the idle check skips
    # a row another transaction holds, to catch it at the next check).
    wait_for_disconnects()
    # As if ARENA_BATTLE_IDLE_SECONDS had passed since the vote.
    Battle.objects.filter(public_id=public_id).update(last_action=timezone.now() - timedelta(hours=1))

    # The leaderboard's refresh check (here the page's first refresh; beat's in production)
    # ends idle battles first, then counts their votes.
    page.goto(live_url + "/leaderboard/")
    battle = Battle.objects.get(public_id=public_id)
    assert battle.is_ended and battle.ended_by == Battle.EndedBy.IDLE
    expect(page.locator("table.leaderboard tbody tr")).to_have_count(2)
    expect(page.locator("table.leaderboard tbody")).to_contain_text(battle.model_b.name)

    page.goto(f"{live_url}/battle/{public_id}/")  # back: the names, and the vote, are shown
    expect(page.locator("#ended-note")).to_contain_text("ended by itself")
    expect(page.locator("#your-votes")).to_have_text("Your votes — first try: B is better.")
    expect(page.locator('.pane[data-side="b"] h2')).to_have_text(f"Model B: {battle.model_b.name}")
    shot(page, "13-idle-battle-revealed")


def evaluation_run(models: list[LLM], *, reply: str, rating: str) -> EvaluationRun:
    """A finished evaluation run with one reliability reply, of a model that has left the arena
    (disabled): the texts of models in the arena are not shown to anonymous visitors."""
    run = EvaluationRun.objects.create(task=Task.objects.create(slug="run", title="Run"), status="done")
    retired, _ = LLM.objects.get_or_create(
        name="retired-model", defaults={"family": "gemma", "preset": models[0].preset, "enabled": False}
    )
    run.llms.set([*models, retired])
    EvaluationReply.objects.create(
        run=run, model=retired, part="reliability", prompt="Add", reply=reply, verdict=rating, rating=rating
    )
    return run


MARKDOWN_AND_PAYLOADS = (
    "**Booked.** Here is the call:\n\n"
    '```python\nadd_calendar_entry("Meeting with Fred", "2024-11-11T17:00")\n```\n\n'
    "- first\n- second\n\n"
    '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>\n\n'
    '[click](javascript:window.pwned=3) ![pic](http://127.0.0.1:9/x.png) <a href="javascript:window.pwned=4">a</a>'
    '<svg onload="window.pwned=5"></svg><iframe src="javascript:window.pwned=6"></iframe>'
)


def test_model_output_renders_as_markdown_and_never_as_html(live_url: str, models: list[LLM], page: Page) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(live_url + "/")
    session_key = next(c["value"] for c in page.context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
    strong, weak = models
    battle = Battle.objects.create(model_a=strong, model_b=weak, voter_key=voter_key_for(session_key))
    for side in "ab":
        Message.objects.create(battle=battle, side=side, turn=0, role="user", content="Add a meeting with Fred")
        Message.objects.create(
            battle=battle, side=side, turn=0, role="assistant", status="done", content=MARKDOWN_AND_PAYLOADS
        )
    page.goto(f"{live_url}/battle/{battle.public_id}/")
    text = reply(page, "a").locator(".text")
    expect(text.locator("strong")).to_have_text("Booked.")
    expect(text.locator("li")).to_have_count(2)
    expect(text.locator(".code-block pre")).to_contain_text('add_calendar_entry("Meeting with Fred"')
    # Raw HTML shows as text; nothing a reply carries runs, loads or links to script.
    expect(text).to_contain_text("<script>window.pwned=2</script>")
    for tag in ("img", "script", "svg", "iframe", 'a[href^="javascript"]', "[onerror]", "[onload]"):
        expect(page.locator(f".log {tag}")).to_have_count(0)
    assert page.evaluate("() => window.pwned") is None
    text.get_by_role("button", name="Copy this code").click()
    expect(text.get_by_role("button", name="Copy this code")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == (
        'add_calendar_entry("Meeting with Fred", "2024-11-11T17:00")\n'
    )
    shot(page, "14-markdown")

    # So does the battle's share page, once it has ended.
    Battle.objects.filter(pk=battle.pk).update(state=Battle.State.ENDED, share_id="markdown-and-payloads")
    page.goto(f"{live_url}/share/markdown-and-payloads/")
    shared = page.locator(".msg.assistant .text").first
    expect(shared.locator("strong")).to_have_text("Booked.")
    expect(shared).to_contain_text("<script>window.pwned=2</script>")
    for tag in ("img", "script", "svg", "iframe", 'a[href^="javascript"]', "[onerror]", "[onload]"):
        expect(page.locator(f".log {tag}")).to_have_count(0)
    assert page.evaluate("() => window.pwned") is None

    # The evaluation page renders model text the same way.
    run = evaluation_run(models, reply=MARKDOWN_AND_PAYLOADS, rating="garbage")
    page.goto(f"{live_url}/evaluations/{run.pk}/")
    page.locator("#reliability summary").first.click()
    cell = page.locator("#reliability [data-markdown]").first
    expect(cell.locator("strong")).to_have_text("Booked.")
    expect(cell).to_contain_text("<script>window.pwned=2</script>")
    for tag in ("img", "script", "svg", "iframe", 'a[href^="javascript"]'):
        expect(page.locator(f"#reliability {tag}")).to_have_count(0)
    assert page.evaluate("() => window.pwned") is None


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_dark_mode_follows_the_system_and_the_toggle(
    live_url: str, models: list[LLM], browser: Browser, viewport: dict[str, int]
) -> None:
    context = browser.new_context(viewport=viewport, color_scheme="dark")
    page = context.new_page()
    background = "() => getComputedStyle(document.body).backgroundColor"
    try:
        page.goto(live_url + "/")
        dark = page.evaluate(background)
        toggle = page.get_by_role("button", name="Dark mode")
        expect(toggle).to_have_attribute("aria-pressed", "true")
        shot(page, "15-dark")
        toggle.click()
        expect(toggle).to_have_attribute("aria-pressed", "false")
        light = page.evaluate(background)
        assert dark != light
        page.goto(live_url + "/leaderboard/")  # the choice is kept
        assert page.evaluate(background) == light
        expect(page.get_by_role("button", name="Dark mode")).to_have_attribute("aria-pressed", "false")
        shot(page, "16-light-chosen")
    finally:
        context.close()
        wait_for_disconnects()


def test_the_arena_page_weighs_at_most_60_kb_compressed(live_url: str, models: list[LLM], page: Page) -> None:
    responses = []
    page.on("response", lambda response: responses.append(response))
    page.goto(live_url + "/", wait_until="networkidle")
    loaded = [r for r in responses if r.url.startswith(live_url)]
    assert {r.status for r in loaded} == {200}
    sizes = {r.url: r.request.sizes() for r in loaded}
    total = sum(size["responseBodySize"] + size["responseHeadersSize"] for size in sizes.values())
    assert total <= 60 * 1024, sizes
    compressed = [r.url for r in loaded if r.header_value("content-encoding") == "gzip"]
    assert len(compressed) == len(loaded), f"sent uncompressed: {set(sizes) - set(compressed)}"


def serious_violations(page: Page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    found = Axe().run(page).response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: {[node['target'] for node in v['nodes']][:4]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def test_every_page_passes_the_accessibility_scan(live_url: str, models: list[LLM], browser: Browser) -> None:
    strong, weak = models
    ended = Battle.objects.create(model_a=strong, model_b=weak, voter_key="axe", state=Battle.State.ENDED)
    Vote.objects.create(battle=ended, choice="a", stage=Vote.Stage.FIRST_TRY)
    run = evaluation_run(models, reply="Done.", rating="correct")
    findings: dict[str, list[str]] = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport=DESKTOP, color_scheme=scheme)
        page = context.new_page()
        try:
            page.goto(live_url + "/")
            expect(page.locator("#send")).to_be_enabled()
            findings[f"arena ({scheme})"] = serious_violations(page)
            page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
            page.keyboard.press("Enter")
            wait_finished(page, "a", 1)
            wait_finished(page, "b", 1)
            reply(page, "a").get_by_role("button", name="Mistake").click()
            expect(page.locator("#target")).to_have_text("To A only — B waits")
            findings[f"battle ({scheme})"] = serious_violations(page)
            page.get_by_role("button", name="Tie").click()
            page.get_by_role("button", name="End battle and reveal").click()
            expect(page.locator("#ended-note")).to_be_visible()
            findings[f"revealed battle ({scheme})"] = serious_violations(page)
            shared = page.locator("#share-link").get_attribute("href")
            for name, path in [
                ("leaderboard", "/leaderboard/"),
                ("evaluations", "/evaluations/"),
                ("evaluation", f"/evaluations/{run.pk}/"),
                ("not found", "/battle/someone-elses/"),
                ("named", "/named/"),
                ("direct", "/direct/"),
                ("share", shared),
            ]:
                page.goto(live_url + path)
                findings[f"{name} ({scheme})"] = serious_violations(page)
        finally:
            context.close()
            wait_for_disconnects()
    assert {page: found for page, found in findings.items() if found} == {}


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_a_named_battle_then_its_share_page(
    live_url: str, models: list[LLM], browser: Browser, viewport: dict[str, int]
) -> None:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    first, second = (llm.name for llm in models)
    try:
        page.goto(live_url + "/named/")
        expect(page).to_have_title("Side by side · Fix Arena")
        page.get_by_label("Model A").select_option(second)
        page.get_by_label("Model B").select_option(first)
        page.fill("#prompt", "Add a meeting with Fred on Nov 11 at 5PM")
        page.keyboard.press("Enter")
        public_id = battle_id(page)
        # The names show from the start: the voter picked them.
        expect(page.locator('.pane[data-side="a"] h2')).to_have_text(f"Model A: {second}")
        expect(page.locator('.pane[data-side="b"] h2')).to_have_text(f"Model B: {first}")
        wait_finished(page, "a", 1)
        wait_finished(page, "b", 1)
        page.get_by_role("button", name="B is better").click()
        page.get_by_role("button", name="End battle and reveal").click()
        expect(page.locator("#ended-note")).to_contain_text("stay off the leaderboard")
        share = page.locator("#share-link")
        expect(share).to_be_visible()
        battle = Battle.objects.get(public_id=public_id)
        assert battle.mode == Battle.Mode.NAMED and battle.excluded
        assert Vote.objects.get(battle=battle).choice == "b"
        shot(page, "17-named")

        # Anyone with the link (another browser, no session) reads it, and cannot act on it.
        stranger = browser.new_context(viewport=viewport).new_page()
        stranger.goto(live_url + share.get_attribute("href"))
        expect(stranger.get_by_role("heading", level=1)).to_have_text(f"{second} vs {first}")
        expect(stranger.locator(".your-votes")).to_contain_text("first try: B is better")
        expect(stranger.locator(".msg.assistant")).to_have_count(2)
        expect(stranger.locator("button, textarea")).to_have_count(1)  # the theme toggle alone
        assert stranger.evaluate("() => document.documentElement.scrollWidth") <= viewport["width"]
        shot(stranger, "18-share")
        stranger.context.close()
    finally:
        context.close()
        wait_for_disconnects()


def test_a_direct_chat_with_one_model(live_url: str, models: list[LLM], page: Page) -> None:
    chosen = models[1].name
    page.goto(live_url + "/direct/")
    page.get_by_label("Model", exact=True).select_option(chosen)
    page.fill("#prompt", "Hello.")  # (more turns, no vote between them: tests/test_arena_modes.py)
    page.keyboard.press("Enter")
    wait_finished(page, "a", 1)
    expect(page.locator('.pane[data-side="b"]')).to_be_hidden()
    expect(page.locator("#votes")).to_be_hidden()
    expect(page.locator("#target")).to_have_text(f"To {chosen}")
    battle = Battle.objects.get(public_id=battle_id(page))
    assert battle.mode == Battle.Mode.DIRECT and battle.model_a.name == chosen
    assert list(Message.objects.filter(battle=battle, role="assistant").values_list("side", flat=True)) == ["a"]
    shot(page, "19-direct-chat")
