"""manage.py serve (what scripts/serve runs) stops within 5 s when asked, in every state: idle,
streaming a battle, warming its roster at its start, loading its models for a first reply, and
mid-evaluation. Replies in flight end
as stopped (their text so far kept), evaluation runs as interrupted, and the admin runs one again.
A Celery worker asked to stop ends its reply the same way, within compose's grace period.

Real processes: the embedded arena as scripts/serve runs it (SQLite, in-memory channel layer,
in-process worker), on the tests' tiny models, is sent SIGTERM or SIGINT by this test; so is a
Celery worker of the production-like stack (PostgreSQL, Redis)."""

import asyncio
import json
import signal
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connection

from inference.hosts import engines
from tests.conftest import PRESETS_DIR
from votes import evaluation_services
from votes.models import Battle, EvaluationReply, EvaluationRun, Message, Task
from votes.testing.stack import Child, Stack, _port_open, database_url, free_port
from votes.testing.voters import session_cookie

STOP_WITHIN_S = 5.0
ADMIN, PASSWORD = "admin", "a-long-password-7"


@pytest.fixture(scope="module")
def arena_var(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded arena's data folder, migrated once, with the tiny models, the bundled tasks
    and an admin: each test serves it from a fresh process."""
    var = tmp_path_factory.mktemp("embedded-var")
    stack = embedded(var, var / "setup-logs")
    for name, command in {
        "migrate": ["migrate", "--noinput"],
        "register": ["register_demo_models", "--dir", str(PRESETS_DIR)],
        "tasks": ["import_tasks", "--keep-existing"],
        "admin": ["createsuperuser", "--noinput", "--username", ADMIN, "--email", "admin@example.org"],
    }.items():
        child = stack.spawn(name, [sys.executable, "manage.py", *command])
        assert child.process.wait(timeout=120) == 0, child.log_tail()
    return var


def embedded(var: Path, logs: Path, **env: str) -> Stack:
    return Stack(
        database_url="",
        redis_url="",
        log_dir=logs,
        env=env
        | {
            "ARENA_VAR_DIR": str(var),
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
            "ARENA_RATE_LIMITS": "battle=30/0/3600,message=20/0/60,vote=60/0/60",
            # Long replies, shown slowly: a battle is still streaming when the signal comes.
            "ARENA_MAX_NEW_TOKENS": "400",
            "ARENA_STREAM_CHARS_PER_S": "20",
        },
    )


@pytest.fixture
def served(arena_var: Path, tmp_path: Path) -> Iterator[tuple[Child, str]]:
    stack = embedded(arena_var, tmp_path / "logs")
    port = free_port()
    server = stack.spawn("serve", [sys.executable, "manage.py", "serve", "--port", str(port)])
    try:
        stack.wait_until(server, lambda: _port_open(port), timeout_s=120)
        yield server, f"http://127.0.0.1:{port}"
    finally:
        stack.stop()


def stop(server: Child, signum: int) -> float:
    """Send ``signum``; seconds until the server exited (it must, with status 0)."""
    sent = time.monotonic()
    server.process.send_signal(signum)
    try:
        returncode = server.process.wait(timeout=30)
    except Exception:
        pytest.fail(f"still running 30 s after signal {signum}:\n{server.log_tail()}")
    took = time.monotonic() - sent
    assert returncode == 0, server.log_tail()
    return took


def rows(var: Path, query: str) -> list[tuple]:
    with sqlite3.connect(var / "arena.sqlite3") as database:
        return database.execute(query).fetchall()


def replies(var: Path) -> list[tuple[str, str, str]]:
    return rows(var, "SELECT status, stop_reason, content FROM votes_message WHERE role = 'assistant' ORDER BY id")


async def start_battle(url: str, until: str) -> None:
    """A fresh voter's first prompt; returns once a frame of type ``until`` came (the voter then
    leaves: closing the loop drops the socket)."""
    cookie = await asyncio.to_thread(session_cookie, url)
    headers = {"Cookie": cookie, "Origin": url}
    socket = await websockets.connect(url.replace("http", "ws", 1) + "/ws/battle/", additional_headers=headers)
    await socket.send(json.dumps({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"}))
    while json.loads(await asyncio.wait_for(socket.recv(), 120))["type"] != until:
        pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_idle_server_stops(served: tuple[Child, str], signum: int) -> None:
    server, _ = served
    assert stop(server, signum) < STOP_WITHIN_S


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_battle_streaming_ends_as_stopped(served: tuple[Child, str], arena_var: Path, signum: int) -> None:
    server, url = served
    asyncio.run(start_battle(url, until="delta"))
    assert stop(server, signum) < STOP_WITHIN_S
    ended = replies(arena_var)[-2:]
    # The side that streamed is stopped with what the voter saw; the other too, unless it had
    # already written its last token and shown it (a model may end a reply at once).
    stopped = [content for status, reason, content in ended if (status, reason) == ("stopped", "shutdown")]
    assert stopped and any(stopped), ended
    assert all(status in ("stopped", "done") for status, _, _ in ended), ended


def test_a_first_reply_loading_its_models_ends_as_stopped(served: tuple[Child, str], arena_var: Path) -> None:
    server, url = served
    asyncio.run(start_battle(url, until="prompt"))  # Accepted: the replies start (and load their models).
    assert stop(server, signal.SIGTERM) < STOP_WITHIN_S
    assert [(status, reason) for status, reason, _ in replies(arena_var)[-2:]] == [("stopped", "shutdown")] * 2
    assert rows(arena_var, "SELECT COUNT(*) FROM votes_message WHERE status IN ('pending', 'streaming')") == [(0,)]


def test_a_server_warming_its_roster_stops(arena_var: Path, tmp_path: Path) -> None:
    """As scripts/serve starts: the roster loads and compiles in the background (inference.warming)."""
    stack = embedded(arena_var, tmp_path / "logs", ARENA_WARM_AT_START="true", ARENA_READY_MODELS_ONLY="true")
    port = free_port()
    server = stack.spawn("serve", [sys.executable, "manage.py", "serve", "--port", str(port)])
    try:
        stack.wait_until(server, lambda: _port_open(port), timeout_s=120)
        states = {model["state"] for model in httpx.get(f"http://127.0.0.1:{port}/roster/").json()["models"]}
        assert "loading" in states, states
        assert stop(server, signal.SIGTERM) < STOP_WITHIN_S
    finally:
        stack.stop()


def test_an_evaluation_run_is_interrupted(served: tuple[Child, str], arena_var: Path) -> None:
    server, url = served
    with httpx.Client(base_url=url, timeout=60) as admin:
        admin.get("/admin/login/")
        login = {"username": ADMIN, "password": PASSWORD, "next": "/admin/"}
        answer = admin.post(
            "/admin/login/?next=/admin/", data={**login, "csrfmiddlewaretoken": admin.cookies["csrftoken"]}
        )
        assert answer.status_code == 302, answer.text[:500]
        (task,) = rows(arena_var, "SELECT id FROM votes_task WHERE slug = 'calendar'")
        action = {"action": "run_evaluation", "_selected_action": task[0], "index": 0}
        answer = admin.post("/admin/votes/task/", data={**action, "csrfmiddlewaretoken": admin.cookies["csrftoken"]})
        assert answer.status_code == 302, answer.text[:500]
    deadline = time.monotonic() + 120
    while rows(arena_var, "SELECT COUNT(*) FROM votes_evaluationrun WHERE status = 'running' AND progress > 0") != [
        (1,)
    ]:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.2)
    assert stop(server, signal.SIGTERM) < STOP_WITHIN_S
    ((status, progress, total),) = rows(arena_var, "SELECT status, progress, total FROM votes_evaluationrun")
    assert status == "interrupted" and 0 < progress < total


@pytest.mark.django_db
def test_the_admin_runs_an_interrupted_evaluation_again(
    admin_client: Any, demo_llms: list[Any], monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """Run again: an interrupted or failed run starts over (its rated replies dropped); a run
    that is done or still going is left alone."""
    started: list[int] = []
    monkeypatch.setattr(evaluation_services, "enqueue_evaluation", started.append)
    task = Task.objects.create(slug="t", title="T", system_prompt="", active=True)
    interrupted, failed, done = (
        EvaluationRun.objects.create(task=task, status=status, progress=3, total=9, error=error)
        for status, error in (("interrupted", ""), ("failed", "RuntimeError: boom"), ("done", ""))
    )
    EvaluationReply.objects.create(
        run=interrupted,
        model=demo_llms[0],
        part="reliability",
        prompt="p",
        reply="r",
        verdict="mistake",
        rating="mistake",
    )
    chosen = [interrupted.pk, failed.pk, done.pk]
    with django_capture_on_commit_callbacks(execute=True):
        answer = admin_client.post(
            "/admin/votes/evaluationrun/", {"action": "run_again", "_selected_action": chosen}, follow=True
        )
    page = answer.content.decode()
    assert f"Started again: {min(interrupted.pk, failed.pk)}, {max(interrupted.pk, failed.pk)}." in page
    assert "1 run(s) left alone" in page
    for run in (interrupted, failed, done):
        run.refresh_from_db()
    assert [(run.status, run.progress, run.error) for run in (interrupted, failed)] == [("pending", 0, "")] * 2
    assert interrupted.replies.count() == 0
    assert (done.status, done.progress) == ("done", 3)
    assert sorted(started) == sorted([interrupted.pk, failed.pk])


def test_an_engine_in_an_xla_call_is_counted_until_its_thread_ends() -> None:
    """A shut-down engine whose decode thread is still in an XLA call (here its warm-up's
    compilations) is counted until the thread ends: a process must not finalise under it (it
    would abort), and votes.shutdown then leaves with os._exit."""
    spec = engines.ModelSpec("stopping-tiny", "gemma", str(PRESETS_DIR / "tiny-gemma"), slots=2, compact=True)
    engine = engines.engine_for(spec)
    warming_up = threading.Thread(target=engine.warm_up)
    warming_up.start()
    deadline = time.monotonic() + 60
    while engine.compilations == 0:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert engines.shutdown_where(lambda s: s.name == spec.name, timeout_s=0) == [spec.name]
    assert engines.still_running() == 1
    warming_up.join(60)
    assert not warming_up.is_alive()
    while engines.still_running():
        assert time.monotonic() < deadline
        time.sleep(0.01)


STUCK_WORKER = """
import threading, time
import django
django.setup()
from celery.signals import worker_shutdown
from inference.hosts import engines
from votes import shutdown, tasks  # noqa: F401  (tasks: the worker's signal handlers)

engines.STOP_TIMEOUT_S = 0.0
engine = engines.engine_for(engines.ModelSpec("stuck", "gemma", {preset!r}, slots=2, compact=True))
threading.Thread(target=engine.warm_up, daemon=True).start()
while engine.compilations == 0:
    time.sleep(0.005)
shutdown.begin()  # As Celery's worker_shutting_down, at SIGTERM.
worker_shutdown.send(sender=None)  # As Celery, once its tasks have ended.
print("finalised under a compilation")
"""


def test_a_stopping_worker_with_an_engine_in_an_xla_call_leaves_without_finalising(tmp_path: Path) -> None:
    """Celery's worker_shutdown with an engine still compiling (its thread cannot be interrupted):
    the worker leaves at once, with status 0. Python's finalisation would end the thread inside
    XLA's C++ code and abort the process (SIGABRT: "FATAL: exception not rethrown")."""
    stack = Stack(database_url="", redis_url="", log_dir=tmp_path)
    child = stack.spawn("stuck", [sys.executable, "-c", STUCK_WORKER.format(preset=str(PRESETS_DIR / "tiny-gemma"))])
    try:
        assert child.process.wait(timeout=120) == 0, child.log_tail()
    finally:
        stack.stop()
    log = child.log.read_text(errors="replace")
    assert "An engine is still in an XLA call" in log and "finalised" not in log, log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_model_host_serving_the_openai_protocol_stops_mid_reply(tmp_path: Path, signum: int) -> None:
    """The model host (``python -m inference.hosts.openai_server``, which ``run_inference_host
    --serve`` runs) gets SIGTERM or Ctrl-C while it streams a completion: it shuts its engines
    down and exits, with status 0, within compose's stop grace period (10 s)."""
    port = free_port()
    stack = Stack(database_url="", redis_url="", log_dir=tmp_path)
    command = [sys.executable, "-m", "inference.hosts.openai_server", "--port", str(port), "--slots", "2"]
    command += ["--compile-lazily", "--model", f"tiny={PRESETS_DIR / 'tiny-gemma'}"]
    host = stack.spawn("model-host", command)
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Add a meeting with Fred on Nov 11 at 5PM"}],
        "max_tokens": 400,
        "stream": True,
    }
    try:
        stack.wait_until(host, lambda: _port_open(port), timeout_s=120)
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=request, timeout=60) as reply:
            assert reply.status_code == 200, reply.read()
            lines = reply.iter_lines()
            while '"content"' not in next(lines):
                pass
            assert stop(host, signum) < 10
    finally:
        stack.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stage", ["prompt", "delta"])
async def test_a_celery_worker_asked_to_stop_ends_its_reply_as_stopped(
    connect_battle: Any, demo_llms: list[Any], celery_worker: Any, settings: Any, tmp_path: Path, stage: str
) -> None:
    """A worker serving one side (its own process, as an inference host) gets SIGTERM while it
    loads its model for the reply ("prompt": the prompt was accepted) or mid-reply ("delta"): it
    exits, with status 0, within compose's stop grace period (10 s), even with its engine in an
    XLA call; its reply ends as stopped with what the voter saw, and the voter is told at once."""
    host_model = demo_llms[0]  # tiny-gemma: runs to its token limit
    host_model.queue, host_model.max_new_tokens = f"stopping-host-{uuid.uuid4().hex[:8]}", 400
    await database_sync_to_async(host_model.save)()
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        env={"ARENA_STREAM_CHARS_PER_S": "30", "ARENA_STREAM_FIRST_TEXT_SECONDS": "0", "ARENA_MAX_NEW_TOKENS": "400"},
    )
    try:
        host = await sync_to_async(stack.start_worker)("stopping-host", [host_model.queue])
        client = await connect_battle()
        await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
        battle_id = (await client.receive())["battle"]
        battle = await database_sync_to_async(Battle.objects.get)(public_id=battle_id)
        side = "a" if battle.model_a_id == host_model.pk else "b"
        if stage == "delta":
            await client.receive_until(lambda f: f["type"] == "delta" and f["side"] == side)
        else:
            # Off the thread the consumer's database calls run on (thread-sensitive sync_to_async):
            # it is still queueing the replies.
            loading = f"Loading {host_model.name}"
            await asyncio.to_thread(stack.wait_until, host, lambda: loading in host.log.read_text(errors="replace"))
        took = await asyncio.to_thread(stop, host, signal.SIGTERM)
        assert took < 10, host.log_tail()
        end = (await client.receive_until(lambda f: f["type"] == "end" and f["side"] == side))[-1]
        reply = await database_sync_to_async(Message.objects.get)(battle=battle, side=side, role="assistant")
        assert (end["status"], reply.status, reply.stop_reason) == ("stopped", "stopped", "shutdown")
        assert reply.content == end["text"]
        assert reply.content or stage == "prompt"
    finally:
        await sync_to_async(stack.stop)()
