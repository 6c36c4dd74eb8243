"""/metrics: Prometheus text for operators only; the arena's counters move with real battles
(through the consumer and a real Celery worker), failures are counted by cause, a leaderboard
refresh records its duration, and a worker serves its own metrics on a port of its own. Series
labelled by model are served only with the bearer token ARENA_METRICS_TOKEN."""

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from arena_site import metrics as site_metrics
from arena_site.celery import app as celery_app
from inference import metrics as inference_metrics
from inference.streaming import GenerationStats
from leaderboard import services as leaderboard_services
from tests.test_generation_failures import LONG_PROMPT
from tests.test_worker_lost import make_reply
from votes import metrics as votes_metrics
from votes import services as votes_services
from votes.models import Message
from votes.testing.stack import Stack, database_url, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
TOKEN = "scraper-token-for-tests"


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(**extra: Any) -> Samples:
    """What Prometheus reads, sending TOKEN (the tests that read per-model series set it)."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metrics_token(settings: Any) -> str:
    settings.ARENA_METRICS_TOKEN = TOKEN
    return TOKEN


def model_series(text: str) -> set[str]:
    return {name for (name, labels) in parse(text) if any(key == "model" for key, _ in labels)}


def test_per_model_series_are_served_only_with_the_token(settings: Any) -> None:
    """The probe: a voter on a network ARENA_METRICS_ALLOWED admits (embedded included, where the
    engines run in the web process) read arena_generated_tokens_total{model=...} before and after
    their battle, and its deltas named the pair. Without ARENA_METRICS_TOKEN (the default) no
    series labelled by model is served to anyone, and each withheld family says so in its HELP;
    with it, only a scraper sending it as a bearer token reads them. The other series stay."""
    votes_metrics.record_reply("metrics-probe-model", "done")
    inference_metrics.record_generation("metrics-probe-model", GenerationStats(tokens=5, ttft_s=0.1, duration_s=0.5))
    settings.ARENA_METRICS_TOKEN = ""
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer "}, {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}):
        text = Client().get("/metrics", **headers).content.decode()
        assert model_series(text) == set(), headers
        assert "metrics-probe-model" not in text
        help_line = next(line for line in text.splitlines() if line.startswith("# HELP arena_generated_tokens_total "))
        assert help_line.endswith(site_metrics.WITHHELD_NOTE)
        assert ("arena_replies_failed_total", (("cause", "too_long"),)) in parse(text)  # the rest stays
    settings.ARENA_METRICS_TOKEN = TOKEN
    for wrong in ("", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN, "Bearer scraper-token-for-test"):
        text = Client().get("/metrics", HTTP_AUTHORIZATION=wrong).content.decode()
        assert model_series(text) == set(), wrong
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert {"arena_generated_tokens_total", "arena_replies_total"} <= model_series(text)
    assert value(parse(text), "arena_replies_total", model="metrics-probe-model", status="done") >= 1
    assert site_metrics.WITHHELD_NOTE not in text
    # OpenMetrics, the other format a scraper may ask for, withholds them alike.
    accept = "application/openmetrics-text; version=1.0.0"
    settings.ARENA_METRICS_TOKEN = ""
    text = Client().get("/metrics", HTTP_ACCEPT=accept).content.decode()
    assert text.endswith("# EOF\n") and "metrics-probe-model" not in text


def test_metrics_are_prometheus_text_with_the_arenas_and_djangos() -> None:
    samples = scrape()
    names = {name for name, _ in samples}
    assert "django_http_requests_before_middlewares_total" in names  # django-prometheus
    for cause in ("too_long", "timed_out", "generation_error", "worker_error", "worker_lost", "not_picked_up"):
        assert ("arena_replies_failed_total", (("cause", cause),)) in samples
    assert "arena_leaderboard_refresh_seconds_count" in names


@pytest.mark.django_db
def test_requests_are_counted_by_view_never_by_path(client: Any) -> None:
    client.get("/leaderboard/")
    text = Client().get("/metrics").content.decode()
    assert 'django_http_requests_latency_seconds_by_view_method_count{method="GET",view="leaderboard:index"}' in text
    assert "/leaderboard/" not in text


def test_metrics_are_refused_to_other_networks_and_to_proxied_requests(settings: Any) -> None:
    assert Client(REMOTE_ADDR="203.0.113.9").get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="::ffff:10.1.2.3").get("/metrics").status_code == 200  # a mapped private one
    # Through a reverse proxy on a private address: the request was relayed, so refused.
    assert Client(REMOTE_ADDR="10.0.0.2").get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    assert Client().get("/metrics", HTTP_FORWARDED="for=203.0.113.9").status_code == 403
    settings.ARENA_METRICS_ALLOWED = ["192.0.2.0/24"]
    assert Client().get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="192.0.2.7").get("/metrics").status_code == 200
    settings.ARENA_METRICS_ALLOWED = []
    assert Client().get("/metrics").status_code == 403


def test_metrics_are_answered_by_address_with_a_real_site_name(settings: Any) -> None:
    """Prometheus scrapes web:8000 by address: no Host check, no HTTPS redirect in its way."""
    settings.ALLOWED_HOSTS = ["arena.example.org"]
    settings.SECURE_SSL_REDIRECT = True
    response = Client().get("/metrics", HTTP_HOST="10.0.0.5:8000")
    assert response.status_code == 200
    assert Client().get("/leaderboard/", HTTP_HOST="10.0.0.5:8000").status_code == 400


async def wait_for(predicate: Any, timeout: float = 10.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = await sync_to_async(scrape)()
        if predicate(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
async def test_a_streamed_battle_moves_the_counters(connect_battle, demo_llms, celery_worker, metrics_token) -> None:
    names = [llm.name for llm in demo_llms]
    before = await sync_to_async(scrape)()
    client = await connect_battle()
    await client.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    battle_id = (await client.receive())["battle"]
    frames = await client.receive_both_ends()
    assert [f["status"] for f in frames if f["type"] == "end"] == ["done", "done"]

    # The slots are freed as the engine ends a request, which the end frame may overtake.
    after = await wait_for(
        lambda s: (
            all(value(s, "arena_engine_slots_in_use", model=name) == 0 for name in names)
            and all(value(s, "arena_replies_total", model=name, status="done") > 0 for name in names)
        )
    )
    for name in names:  # Both sides' models: each wrote its reply.
        assert value(after, "arena_generated_tokens_total", model=name) > value(
            before, "arena_generated_tokens_total", model=name
        )
        ttft = "arena_time_to_first_token_seconds_count"
        assert value(after, ttft, model=name) == value(before, ttft, model=name) + 1
        assert value(after, "arena_time_to_first_token_seconds_sum", model=name) > 0
        assert value(after, "arena_reply_tokens_per_second_count", model=name) >= 1
        done = value(after, "arena_replies_total", model=name, status="done")
        assert done == value(before, "arena_replies_total", model=name, status="done") + 1
        assert value(after, "arena_engine_slots", model=name) == settings.ARENA_ENGINE_SLOTS
        assert value(after, "arena_engine_slots_in_use", model=name) == 0
        assert value(after, "arena_engine_queued_requests", model=name) == 0
    text = await sync_to_async(lambda: Client().get("/metrics").content.decode())()
    assert battle_id not in text  # Nothing ties a model to a battle.


@pytest.mark.django_db(transaction=True)
async def test_failed_replies_are_counted_by_cause(
    connect_battle, demo_llms, celery_worker, metrics_token, settings
) -> None:
    settings.ARENA_MAX_CONVERSATION_BYTES = 100_000  # Past the models' own context (a named battle).
    before = await sync_to_async(scrape)()
    client = await connect_battle()
    await client.send({"type": "start", "mode": "named", "models": [llm.name for llm in demo_llms]})
    await client.receive_until(lambda frame: frame["type"] == "state")
    await client.send({"type": "prompt", "text": LONG_PROMPT})
    await client.receive()
    frames = await client.receive_both_ends()
    assert [f["status"] for f in frames if f["type"] == "end"] == ["failed", "failed"]
    after = await sync_to_async(scrape)()
    too_long = "arena_replies_failed_total"
    assert value(after, too_long, cause="too_long") == value(before, too_long, cause="too_long") + 2
    assert value(after, too_long, cause="generation_error") == value(before, too_long, cause="generation_error")
    failed = sum(value(after, "arena_replies_total", model=llm.name, status="failed") for llm in demo_llms)
    assert failed == sum(value(before, "arena_replies_total", model=llm.name, status="failed") for llm in demo_llms) + 2


@pytest.mark.django_db(transaction=True)
def test_replies_failed_outside_the_worker_are_counted_by_cause(demo_llms, settings) -> None:
    """Failed by the stall check (beat, or a page's connect) and at once by a worker's error."""
    settings.ARENA_REPLY_STALL_SECONDS = 30
    settings.ARENA_REPLY_QUEUE_SECONDS = 300
    make_reply(demo_llms, Message.Status.STREAMING, 31)
    make_reply(demo_llms, Message.Status.PENDING, 301)
    broken = make_reply(demo_llms, Message.Status.STREAMING, 1)
    before = scrape()
    assert len(votes_services.fail_stalled_replies()) == 2
    assert votes_services.fail_reply(broken.pk, votes_services.WORKER_ERROR) is not None
    after = scrape()
    for cause in ("worker_lost", "not_picked_up", "worker_error"):
        failed = "arena_replies_failed_total"
        assert value(after, failed, cause=cause) == value(before, failed, cause=cause) + 1, cause


@pytest.mark.django_db(transaction=True)
def test_a_leaderboard_refresh_records_its_duration() -> None:
    before = scrape()
    refresh = leaderboard_services.refresh_leaderboard(rounds=20)
    after = scrape()
    count, total = "arena_leaderboard_refresh_seconds_count", "arena_leaderboard_refresh_seconds_sum"
    assert value(after, count) == value(before, count) + 1
    assert value(after, total) - value(before, total) == pytest.approx(refresh.seconds)
    for stage in refresh.stages:
        stage_count = "arena_leaderboard_refresh_stage_seconds_count"
        assert value(after, stage_count, stage=stage) == value(before, stage_count, stage=stage) + 1


@pytest.mark.django_db(transaction=True)
def test_a_prefork_worker_serves_its_pool_processes_metrics_on_its_port(tmp_path: Path, run_id: str) -> None:
    """The default queue's worker as compose runs it (prefork pool, PROMETHEUS_MULTIPROC_DIR):
    its port serves what its pool processes recorded, here a leaderboard refresh from beat's job."""
    port, queue = free_port(), f"test-{run_id}.metrics"
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        env={
            "ARENA_METRICS_PORT": str(port),
            "ARENA_METRICS_ADDRESS": "127.0.0.1",
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        },
    )
    try:
        worker = stack.spawn(
            "worker",
            [
                sys.executable, "-m", "celery", "-A", "arena_site", "worker", "--pool", "prefork", "--concurrency", "1",
                "--queues", queue, "--hostname", f"metrics-{run_id}@%h", "--without-gossip", "--without-mingle",
                "--loglevel", "INFO",
            ],
        )  # fmt: skip
        stack.wait_until(worker, lambda: " ready." in worker.log.read_text(errors="replace"))
        celery_app.send_task("leaderboard.refresh_if_due", queue=queue)
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                samples = parse(response.read().decode())
            if value(samples, "arena_leaderboard_refresh_seconds_count") >= 1:
                break
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
        assert ("arena_replies_failed_total", (("cause", "worker_lost"),)) in samples
    finally:
        stack.stop()
