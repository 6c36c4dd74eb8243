"""Models warm before the first voter, and the arena says which are ready (inference.readiness,
inference.warming). Hosts report each model loading, ready or failed, for a limited time; battles
draw and voters pick only ready models, and with none ready a voter is told so, not left
waiting; GET /api/v1/models and the fresh pages show each model's state. The embedded arena
(manage.py serve, a real process) loads and compiles its roster in the background from its start.
Real Redis (the cache the hosts report to), real websockets, the tests' tiny models."""

import random
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import Client
from playwright.sync_api import Browser
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inference import readiness, warming
from inference.hosts import engines
from inference.models import LLM
from inference.readiness import State
from tests.conftest import PRESETS_DIR
from tests.model_servers import serve_in_thread
from votes import bench_first_text, selectors, services
from votes.models import Battle, Message
from votes.testing.stack import Stack, _port_open, free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready_only(settings: Any) -> Iterator[Any]:
    settings.ARENA_READY_MODELS_ONLY = True
    yield settings
    for model in LLM.objects.all():
        readiness.forget(model.name)


def roster(count: int) -> list[LLM]:
    return [
        LLM.objects.create(name=f"model-{index}", family="gemma", preset=f"p{index}", context_tokens=2048)
        for index in range(count)
    ]


def drawn(battles: int, rng: random.Random) -> set[int]:
    """The models that many anonymous battles drew."""
    models: set[int] = set()
    for _ in range(battles):
        battle = services.start_battle(voter_key="voter", rng=rng)
        models |= {battle.model_a_id, battle.model_b_id}
    return models


def test_a_report_counts_while_its_host_repeats_it() -> None:
    readiness.report("warm-one", State.LOADING)
    loading = readiness.states(["warm-one"])["warm-one"]
    readiness.report("warm-one", State.READY)
    readiness.report("warm-one", State.READY)
    ready = readiness.states(["warm-one"])["warm-one"]
    assert loading.state is State.LOADING and ready.ready and ready.since >= loading.since
    # A host that stopped repeating it: after the TTL the model is unknown again.
    later = time.time() + settings.ARENA_MODEL_STATE_TTL_SECONDS + 1
    assert readiness.states(["warm-one", "never-reported"], now=later) == {
        "warm-one": readiness.UNKNOWN,
        "never-reported": readiness.UNKNOWN,
    }
    readiness.forget("warm-one")
    assert not readiness.states(["warm-one"])["warm-one"].ready


def test_anonymous_battles_draw_only_ready_models(ready_only: Any) -> None:
    models = roster(4)
    for model in models[:3]:
        readiness.report(model.name, State.READY)
    readiness.report(models[3].name, State.LOADING)
    rng = random.Random(7)
    assert drawn(60, rng) == {model.pk for model in models[:3]}
    # Off (ARENA_READY_MODELS_ONLY=false): every enabled model is drawn, loaded at first use.
    ready_only.ARENA_READY_MODELS_ONLY = False
    assert drawn(60, rng) == {model.pk for model in models}


def test_with_too_few_ready_a_battle_is_refused_saying_why(ready_only: None) -> None:
    models = roster(3)
    readiness.report(models[0].name, State.READY)
    readiness.report(models[1].name, State.LOADING)
    with pytest.raises(services.ArenaError) as refused:
        services.start_battle(voter_key="voter")
    assert refused.value.code == "no_models"
    assert "warming up: 1 of 3 ready, and a battle needs 3" in str(refused.value)
    # No host answers for any of them (all failed, or none started): said so.
    for model in models:
        readiness.report(model.name, State.FAILED, detail="out of memory")
    with pytest.raises(services.ArenaError) as refused:
        services.start_battle(voter_key="voter")
    assert "None of the arena's 3 models is ready" in str(refused.value)
    assert Battle.objects.count() == 0


def test_two_ready_out_of_more_do_not_make_a_battle_whose_pair_is_known(ready_only: None) -> None:
    """Which models are ready is public: with two ready out of four, every battle's pair would be
    known. Anonymous battles wait for three (ARENA_MIN_READY_MODELS); a model that failed to load
    is out of the draw, as a disabled one is."""
    models = roster(4)
    for model in models[:2]:
        readiness.report(model.name, State.READY)
    readiness.report(models[2].name, State.LOADING)
    with pytest.raises(services.ArenaError) as refused:
        services.start_battle(voter_key="voter")
    assert "2 of 4 ready, and a battle needs 3" in str(refused.value)
    readiness.report(models[2].name, State.READY)
    readiness.report(models[3].name, State.FAILED, detail="out of memory")
    rng = random.Random(3)
    assert drawn(40, rng) == {model.pk for model in models[:3]}
    # Two left that have not failed: the roster is those two, as it would be with two enabled.
    readiness.report(models[2].name, State.FAILED, detail="out of memory")
    battle = services.start_battle(voter_key="voter", rng=rng)
    assert {battle.model_a_id, battle.model_b_id} == {models[0].pk, models[1].pk}


def test_a_voter_cannot_pick_a_model_that_is_not_ready(ready_only: None) -> None:
    models = roster(2)
    readiness.report(models[0].name, State.READY)
    with pytest.raises(services.ArenaError) as refused:
        services.start_battle(voter_key="voter", mode=Battle.Mode.NAMED, models=["model-0", "model-1"])
    assert refused.value.code == "model_not_ready" and "model-1 is not ready yet" in str(refused.value)
    direct = services.start_battle(voter_key="voter", mode=Battle.Mode.DIRECT, models=["model-0"])
    assert direct.model_a_id == models[0].pk


async def test_the_first_prompt_with_no_ready_model_gets_a_clear_error(ready_only: None, connect_battle) -> None:
    await sync_to_async(roster)(2)
    page = await connect_battle()
    await page.send({"type": "prompt", "text": "Add a meeting with Fred on Nov 11 at 5PM"})
    error = await page.receive()
    assert error["type"] == "error" and error["code"] == "no_models"
    assert "warming up" not in error["message"] and "not answering" in error["message"]
    assert await sync_to_async(Battle.objects.count)() == 0


def test_the_api_and_the_pages_say_which_models_are_ready(ready_only: None) -> None:
    models = roster(3)
    readiness.report(models[0].name, State.READY)
    readiness.report(models[1].name, State.LOADING)
    listed = Client().get("/api/v1/models").json()
    assert [(m["name"], m["ready"], m["state"]) for m in listed] == [
        ("model-0", True, "ready"),
        ("model-1", False, "loading"),
        ("model-2", False, "unknown"),
    ]
    arena = Client().get("/").content.decode()
    assert "Warming up: 1 of 3 models are ready, and a battle needs 3." in arena and "data-watch" in arena
    named = Client().get("/named/").content.decode()
    assert '<option value="model-1" disabled>model-1 (loading)</option>' in named
    assert '<option value="model-0" selected>model-0</option>' not in named  # The second is selected.
    status = Client().get("/roster/").json()
    assert (status["ready"], status["warming"], status["total"], status["needed"]) == (1, 1, 3, 3)
    assert not status["battles_possible"]
    readiness.report(models[2].name, State.READY)
    readiness.report(models[1].name, State.READY)
    assert "All 3 models are ready." in Client().get("/").content.decode()
    assert Client().get("/roster/").json()["battles_possible"]


def test_the_warmer_loads_compiles_and_reports_the_roster(ready_only: None, monkeypatch: Any) -> None:
    """In process, on the tiny models: each is reported loading, then ready once its engine has
    compiled every shape; a model that cannot load is reported failed with the reason, and is not
    tried again until its roster entry changes."""
    tiny = LLM.objects.create(
        name="warm-tiny", family="gemma", preset=str(PRESETS_DIR / "tiny-gemma"), context_tokens=2048
    )
    broken = LLM.objects.create(name="warm-broken", family="gemma", preset="/no/such/preset", context_tokens=2048)
    tried: list[str] = []
    original = engines.warm_up

    def counted(spec: engines.ModelSpec) -> Any:
        tried.append(spec.name)
        return original(spec)

    monkeypatch.setattr(engines, "warm_up", counted)
    warmer = warming.Warmer(lambda: [tiny, broken], check_endpoints=False)
    warmer.warm_pass()
    warmer.warm_pass()  # Nothing left to warm: the tiny model runs, the broken one failed.
    assert tried == ["warm-tiny", "warm-broken"]
    engine = engines.running_engines()["warm-tiny"]
    compiled = engine.compilations
    states = readiness.states(["warm-tiny", "warm-broken"])
    assert states["warm-tiny"].ready
    assert states["warm-broken"].state is State.FAILED and "no/such/preset" in states["warm-broken"].detail
    # Warm: a first reply compiles nothing more.
    engine.submit("Hello", max_new_tokens=4).result(timeout=60)
    assert engine.compilations == compiled
    # The reports are repeated (the failure too, with its reason), and taken back when the host stops.
    readiness.forget("warm-tiny")
    readiness.forget("warm-broken")
    warmer.report_pass()
    states = readiness.states(["warm-tiny", "warm-broken"])
    assert states["warm-tiny"].ready
    assert states["warm-broken"].state is State.FAILED and "no/such/preset" in states["warm-broken"].detail
    warmer.stop()
    assert not readiness.states(["warm-tiny"])["warm-tiny"].ready
    engines.shutdown_where(lambda spec: spec.name == "warm-tiny")


def test_a_model_served_elsewhere_is_ready_while_its_server_lists_it(ready_only: None) -> None:
    listed = {"served": True}

    async def models(request: Request) -> Response:
        data = [{"id": "remote-model", "object": "model"}] if listed["served"] else []
        return JSONResponse({"object": "list", "data": data})

    with serve_in_thread(Starlette(routes=[Route("/v1/models", models)])) as url:
        remote = LLM.objects.create(
            name="remote", endpoint_url=url, served_model="remote-model", context_tokens=2048, family="gemma"
        )
        assert warming.check_endpoints() == 1
        assert readiness.states(["remote"])["remote"].ready
        listed["served"] = False
        warming.check_endpoint(remote)
        state = readiness.states(["remote"])["remote"]
        assert state.state is State.FAILED and "does not list 'remote-model'" in state.detail
    LLM.objects.filter(pk=remote.pk).update(endpoint_url=f"http://127.0.0.1:{free_port()}/v1")
    warming.check_endpoint(LLM.objects.get(pk=remote.pk))
    assert readiness.states(["remote"])["remote"].state is State.FAILED


def test_a_fresh_embedded_arena_warms_its_roster_before_the_first_voter(tmp_path: Path, browser: Browser) -> None:
    """manage.py serve, as scripts/serve runs it, on the tiny models: from its start it loads and
    compiles them in the background, the API shows them loading and then ready, and the benchmark
    of a voter's wait (manage.py bench_first_text's, in chromium) plays battles on it."""
    stack = Stack(
        database_url="",
        redis_url="",
        log_dir=tmp_path / "logs",
        env={"ARENA_VAR_DIR": str(tmp_path), "ARENA_WARM_AT_START": "true", "ARENA_READY_MODELS_ONLY": "true"},
    )
    for name, command in {
        "migrate": ["migrate", "--noinput"],
        "register": ["register_demo_models", "--dir", str(PRESETS_DIR)],
    }.items():
        child = stack.spawn(name, [sys.executable, "manage.py", *command])
        assert child.process.wait(timeout=120) == 0, child.log_tail()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = stack.spawn("serve", [sys.executable, "manage.py", "serve", "--port", str(port)])
    try:
        stack.wait_until(server, lambda: _port_open(port), timeout_s=120)
        # Warming when the first voter could come (the API is throttled: asked once, the page's
        # own poll after).
        first = httpx.get(url + "/api/v1/models", timeout=10).json()
        assert "loading" in {model["state"] for model in first}, first

        def all_ready() -> bool:
            return all(model["state"] == "ready" for model in httpx.get(url + "/roster/", timeout=10).json()["models"])

        stack.wait_until(server, all_ready, timeout_s=300)
        assert all(model["ready"] for model in httpx.get(url + "/api/v1/models", timeout=10).json())
        # Serving its models, the process holds none of the packages only the tests use
        # (inference.test_only_packages): Keras runs without them.
        mapped = Path(f"/proc/{server.process.pid}/maps").read_text()
        assert "/jaxlib/" in mapped and "/sklearn/" not in mapped and "/pandas/" not in mapped
        report = bench_first_text.measure(url, 2, browser=browser, ready_timeout_s=10)
        assert len(report.battles) == 2
        for battle in report.battles:
            assert 0 < battle.first_side_s <= battle.both_sides_s <= battle.finished_s
        summary = report.summary()["first_side_s"]
        assert summary["median"] <= summary["p90"] <= summary["max"]
        assert "is ready" in server.log_tail(200)
        # Each battle's models' own times, from the arena's database (the command reads its own).
        with sqlite3.connect(tmp_path / "arena.sqlite3") as database:

            def slower_model_s(battle_id: str) -> float | None:
                (longest,) = database.execute(
                    "SELECT MAX(m.generation_ms) FROM votes_message m JOIN votes_battle b ON m.battle_id = b.id "
                    "WHERE b.public_id = ? AND m.role = 'assistant'",
                    (battle_id,),
                ).fetchone()
                return None if longest is None else longest / 1000

            timed = report.with_model_times(slower_model_s)
        for battle in timed.battles:
            assert battle.slower_model_s is not None and 0 < battle.slower_model_s <= battle.finished_s
            assert battle.over_slower_model is not None and battle.over_slower_model >= 1
        assert "over_slower_model" in timed.summary()
    finally:
        stack.stop()


def test_the_wall_time_is_set_against_what_the_slowest_drawable_model_needs() -> None:
    """bench_first_text's second ratio: the slowest model anonymous battles may draw (a greedy one
    is not drawn, so not counted), at its median time to first token and speed on its recent
    replies, writing the battle's longer reply."""
    fields = {"family": "llama3", "preset": "unused", "context_tokens": 1 << 20, "top_p": 0.95, "top_k": 0}
    fast, slow, greedy = (
        LLM.objects.create(name=name, queue=name, temperature=temperature, **fields)
        for name, temperature in (("fast", 0.7), ("slow", 0.7), ("greedy", 0.0))
    )
    measured = {fast: [(100, 200), (120, 300), (80, 100)], slow: [(4, 1000), (5, 2000), (6, 3000)], greedy: [(1, 9000)]}
    for model, replies in measured.items():
        for chars_per_s, first_ms in replies:
            battle = Battle.objects.create(model_a=model, model_b=slow if model == fast else fast, voter_key="v")
            Message.objects.create(
                battle=battle,
                side="a",
                turn=0,
                role="assistant",
                status="done",
                content="x",
                model_chars_per_s=chars_per_s,
                time_to_first_token_ms=first_ms,
            )
    battle = Battle.objects.create(model_a=fast, model_b=slow, voter_key="v")
    for side, length in (("a", 30), ("b", 50)):
        Message.objects.create(battle=battle, side=side, turn=0, role="user", content="Add a meeting with Fred")
        Message.objects.create(battle=battle, side=side, turn=0, role="assistant", status="done", content="y" * length)

    # The slow model: 2 s to its first token, then 50 characters at 5 a second.
    assert selectors.slowest_model_seconds(battle.public_id) == pytest.approx(12.0)
    assert selectors.slowest_model_seconds("no-such-battle") is None
    report = bench_first_text.Report(
        "http://arena", [bench_first_text.Battle(1.0, 1.5, 18.0, battle_id=battle.public_id)]
    ).with_model_times(lambda battle_id: 9.0, selectors.slowest_model_seconds)
    (timed,) = report.battles
    assert (timed.over_slower_model, timed.over_slowest_model) == (pytest.approx(2.0), pytest.approx(1.5))
    assert report.summary()["over_slowest_model"]["median"] == pytest.approx(1.5)
    assert report.as_dict()["battles"][0]["over_slowest_model"] == pytest.approx(1.5)


def test_the_benchmark_waits_for_an_arena_that_does_not_answer_yet_and_says_why_it_gave_up() -> None:
    """``scripts/serve & manage.py bench_first_text``: the arena is not listening yet."""
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(bench_first_text.NotReady, match=r"Not warm after 1 s: .* does not answer"):
        bench_first_text.wait_until_warm(url, timeout_s=1)
