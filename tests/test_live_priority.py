"""Live replies first: an evaluation run's requests (background) yield to battle replies
(foreground) across every engine of the process (``inference.engine.priority``), and evaluation
runs show their progress and can be cancelled. Engines on the smallest bundled preset."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras_hub
import pytest
from django.db import connections
from django.urls import reverse

from inference.chat_templates import ChatTurn, render_prompt
from inference.engine import DEFAULT_STEPS_PER_DISPATCH, Engine, Request
from inference.engine.priority import FOREGROUND
from inference.hosts import engines as host_engines
from inference.models import LLM
from inference.registry import PresetInfo, local_presets
from votes import evaluation_services, services
from votes.management.commands.import_tasks import BUNDLED_TASKS
from votes.models import EvaluationReply, EvaluationRun, Task

PRESET: PresetInfo = local_presets(Path(__file__).resolve().parents[1] / "inference" / "presets")[0]
SLOTS = 2
# Tokens a background request may still make once foreground work starts: the dispatch already
# under way and the one its reader may have been handed.
SLACK = 2 * DEFAULT_STEPS_PER_DISPATCH
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")


@pytest.fixture(scope="module")
def lm() -> keras_hub.models.CausalLM:
    return keras_hub.models.CausalLM.from_preset(str(PRESET.path))


@pytest.fixture(scope="module")
def engines(lm: keras_hub.models.CausalLM) -> Iterator[tuple[Engine, Engine]]:
    """Two engines of one process, as the embedded arena runs one per model."""
    first, second = Engine(lm, slots=SLOTS, buckets=(64,), windows=(128,)), Engine(lm, slots=SLOTS)
    try:
        first.warm_up()
        second.warm_up()
        yield first, second
    finally:
        first.shutdown()
        second.shutdown()


@pytest.fixture(scope="module")
def prompt() -> str:
    return render_prompt(PRESET.family, None, [ChatTurn("user", "Add a meeting with Fred on Nov 11 at 5PM")])


def long_request(engine: Engine, prompt: str, *, background: bool, tokens: int = 300) -> Request:
    return engine.submit(prompt, max_new_tokens=tokens, ignore_stop_tokens=True, background=background)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert condition(), "timed out"


@pytest.mark.parametrize("background", [True, False], ids=["evaluation", "control: both live"])
def test_background_work_waits_while_a_live_reply_runs_on_another_engine(
    engines: tuple[Engine, Engine], prompt: str, background: bool
) -> None:
    evaluating, serving = engines
    other = long_request(evaluating, prompt, background=background, tokens=400)
    other_deltas = iter(other)
    next(other_deltas)  # Running.
    live = long_request(serving, prompt, background=False, tokens=300)
    before = len(other.token_ids)
    list(live)
    made = len(other.token_ids) - before
    assert live.stop_reason == "length" and live.stats.tokens == 300
    if background:
        assert made <= SLACK, f"the evaluation's request made {made} tokens while the live reply ran"
    else:
        assert made > SLACK, "the control shows what the live reply shares its cores with"
    list(other_deltas)  # It then goes on, from where it was, to its end.
    assert other.stop_reason == "length" and other.stats.tokens == 400


def test_a_background_request_paused_mid_reply_gives_the_text_it_gives_alone(
    engines: tuple[Engine, Engine], prompt: str
) -> None:
    evaluating, serving = engines
    alone = evaluating.submit(prompt, max_new_tokens=120, background=True)
    expected = "".join(alone)
    paused = evaluating.submit(prompt, max_new_tokens=120, background=True)
    deltas = iter(paused)
    first = next(deltas)
    live = long_request(serving, prompt, background=False)
    wait_until(lambda: evaluating.yielding or live.done)
    list(live)
    assert first + "".join(deltas) == expected == paused.text


def test_a_queued_background_request_starts_after_the_live_reply_in_its_engine(
    engines: tuple[Engine, Engine], prompt: str
) -> None:
    engine = engines[0]
    live = long_request(engine, prompt, background=False)
    next(iter(live))
    queued = engine.submit(prompt, max_new_tokens=10, background=True)
    list(queued)
    assert live.done and queued.stop_reason in ("stop", "length")
    # Its first token came after the live reply had ended (both clocks are perf_counter's).
    assert queued._submitted + queued.stats.ttft_s > live._submitted + live.stats.duration_s


def test_a_live_reply_beside_a_running_background_one_in_its_engine_runs_with_it(
    engines: tuple[Engine, Engine], prompt: str
) -> None:
    engine = engines[1]
    background = long_request(engine, prompt, background=True, tokens=400)
    deltas = iter(background)
    next(deltas)
    live = long_request(engine, prompt, background=False, tokens=100)
    before = len(background.token_ids)
    list(live)
    # A decode step computes every slot: the background one rides along and is not held.
    assert live.stats.tokens == 100 and len(background.token_ids) - before > SLACK
    list(deltas)
    assert background.stats.tokens == 400


def test_a_held_background_request_can_be_cancelled(engines: tuple[Engine, Engine], prompt: str) -> None:
    engine = engines[0]
    background = long_request(engine, prompt, background=True)
    deltas = iter(background)
    next(deltas)
    FOREGROUND.enter()  # A live reply elsewhere in the process (say, on a model host's thread).
    try:
        wait_until(lambda: engine.yielding)
        held = len(background.token_ids)
        background.cancel()
        list(deltas)
        assert background.stop_reason == "cancelled"
        assert len(background.token_ids) <= held + SLACK
        assert engine.active_slots == 0
    finally:
        FOREGROUND.leave()
    assert FOREGROUND.count == 0


# --- Evaluation runs: the background lane, progress and cancel --------------------------------


@pytest.fixture
def calendar(db: None) -> Task:
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    return Task.objects.get(slug="calendar")


def small_run(task: Task, llms: list[LLM]) -> EvaluationRun:
    """Two reliability attempts and the six-turn dialog, nothing else: 8 steps per model."""
    counts = {"attempts": 2, "max_tries": 0, "fix_attempts": 0, "decoys": 0, "feedback_mistakes": 0}
    return evaluation_services.create_evaluation(task=task, llms=llms, **counts)


def test_a_running_evaluation_shows_its_progress_and_time_left(
    client: Any, admin_client: Any, demo_llms: list[LLM], calendar: Task
) -> None:
    run = small_run(calendar, demo_llms[:1])
    progress_url = reverse("votes:evaluation_progress", args=[run.pk])
    page_url = reverse("votes:evaluation", args=[run.pk])
    waiting = client.get(progress_url).json()
    assert (waiting["status"], waiting["progress"], waiting["total"], waiting["seconds_left"]) == (
        "pending",
        0,
        8,
        None,
    )
    assert waiting["unfinished"]
    staff_page, public_page = admin_client.get(page_url).content.decode(), client.get(page_url).content.decode()
    assert "data-live" in staff_page and 'id="run-bar"' in staff_page and "Cancel this run" in staff_page
    assert "data-live" in public_page and "Cancel this run" not in public_page  # Staff only.

    seen: list[dict[str, Any]] = []
    admin_rows: list[str] = []

    def on_step() -> None:  # Called by the run after each step, as the page polls meanwhile.
        seen.append(client.get(progress_url).json())
        admin_rows.append(admin_client.get("/admin/votes/evaluationrun/").content.decode())

    evaluation_services.run_evaluation(run.pk, on_step=on_step)
    assert [state["progress"] for state in seen] == list(range(1, 9))
    assert {state["status"] for state in seen} == {"running"}
    lefts = [state["seconds_left"] for state in seen]
    assert all(isinstance(left, int) and left >= 0 for left in lefts) and lefts[-1] == 0
    assert "about " in admin_rows[0]  # The admin's list shows the time left too.
    done = client.get(progress_url).json()
    assert (done["status"], done["unfinished"], done["seconds_left"]) == ("done", False, None)
    assert "data-live" not in client.get(page_url).content.decode()
    assert client.get(reverse("votes:evaluation_progress", args=[run.pk + 1000])).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_run_stops_its_reply_held_behind_a_live_one(demo_llms: list[LLM], calendar: Task) -> None:
    """While a live reply runs in the process, an evaluation's reply waits in the engine; a
    cancel stops it there, within seconds, and the run keeps nothing."""
    model = demo_llms[0]
    run = small_run(calendar, [model])
    ended = threading.Event()

    def work() -> None:
        try:
            evaluation_services.run_evaluation(run.pk)
        finally:
            connections.close_all()
            ended.set()

    FOREGROUND.enter()  # A live battle's reply on another model.
    try:
        threading.Thread(target=work, name="evaluation", daemon=True).start()
        engine = lambda: host_engines.running_engines().get(model.name)  # noqa: E731
        wait_until(lambda: engine() is not None and engine().queued == 1, timeout=120)
        assert EvaluationRun.objects.get(pk=run.pk).progress == 0  # Held: not one step done.
        assert evaluation_services.cancel_evaluation(run)
        assert ended.wait(timeout=10), "the cancelled run did not stop"
        assert engine().queued == 0 and engine().active_slots == 0
    finally:
        FOREGROUND.leave()
    run.refresh_from_db()
    assert (run.status, run.progress, run.finished is not None) == ("cancelled", 0, True)
    assert not EvaluationReply.objects.filter(run=run).exists()


def test_staff_cancel_a_run_from_its_page_and_from_the_admin(
    client: Any,
    admin_client: Any,
    demo_llms: list[LLM],
    calendar: Task,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    started: list[int] = []
    monkeypatch.setattr(evaluation_services, "enqueue_evaluation", started.append)
    first, second, done = (small_run(calendar, demo_llms) for _ in range(3))
    EvaluationRun.objects.filter(pk=done.pk).update(status=EvaluationRun.Status.DONE)
    cancel_url = reverse("votes:cancel_evaluation", args=[first.pk])
    assert client.post(cancel_url).status_code == 403  # Not staff.
    assert admin_client.get(cancel_url).status_code == 405  # A change: POST only.
    first.refresh_from_db()
    assert first.status == "pending"

    page = admin_client.post(cancel_url, follow=True).content.decode()
    assert f"Evaluation #{first.pk} cancelled" in page
    first.refresh_from_db()
    assert first.status == "cancelled" and first.finished is not None
    assert "had already ended" in admin_client.post(cancel_url, follow=True).content.decode()
    evaluation_services.run_evaluation(first.pk)  # A worker that picks it up later does nothing.
    first.refresh_from_db()
    assert (first.status, first.progress) == ("cancelled", 0)

    changelist = "/admin/votes/evaluationrun/"
    page = admin_client.post(
        changelist, {"action": "cancel", "_selected_action": [second.pk, done.pk]}, follow=True
    ).content.decode()
    assert f"Cancelled: {second.pk}." in page and "1 run(s) left alone: they had already ended" in page
    second.refresh_from_db()
    done.refresh_from_db()
    assert (second.status, done.status) == ("cancelled", "done")

    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(changelist, {"action": "run_again", "_selected_action": [first.pk]})
    first.refresh_from_db()
    assert first.status == "pending" and first.started is None and started == [first.pk]


@pytest.mark.django_db(transaction=True)
def test_the_benchmark_times_live_replies_beside_a_real_evaluation_run(
    demo_llms: list[LLM], calendar: Task, tmp_path: Path
) -> None:
    """bench_live_priority's three ways, on the tiny models: what it reports, not how fast."""
    from django.core.management import call_command

    names = [model.name for model in demo_llms]
    out = tmp_path / "bench.json"
    options = ["--replies", "2", "--json", str(out), "--no-warm-up"]
    call_command("bench_live_priority", "--live", names[0], "--evaluate", *names, *options)
    report = json.loads(out.read_text())
    assert list(report) == ["alone", "evaluation, background lane", "evaluation, no lane"]
    for way, figures in report.items():
        assert len(figures["replies"]) == 2 and all(reply["tokens"] > 0 for reply in figures["replies"])
        assert figures["median_tokens_per_s"] > 0
        assert (figures["evaluation_steps"] is None) == (way == "alone")
    assert report["alone"]["ratio_to_alone"] == 1
    assert all(report[way]["evaluation_steps"] >= 1 for way in list(report)[1:])
    assert not EvaluationRun.objects.exists()  # Its runs are deleted.
