"""Models served elsewhere, through the OpenAI-compatible protocol: the client against the
arena's own keras-hub host behind HTTP (a child process) and against a server that fails in every
way a model server can; a battle through daphne's consumer, the channel layer and a real Celery
worker against an endpoint model; Stop freeing the host's slot; the API key's path; and
``add_endpoint_model``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.management import CommandError, call_command

from inference import services
from inference.chat_templates import ChatTurn
from inference.clients.base import GREEDY, Sampling
from inference.clients.local import LocalEngineClient
from inference.clients.openai_compatible import Endpoint, EndpointError, OpenAICompatibleClient
from inference.models import LLM
from tests.conftest import PRESETS_DIR
from tests.model_servers import FaultyServer, free_port, host_health, keras_hub_host, serve_in_thread
from votes import generation
from votes.models import Message

SYSTEM = "You are a helpful vocal assistant on a mobile device."
CONVERSATION = [ChatTurn(role="user", content="Add a meeting with Fred on Nov 11 at 5PM")]
REMOTE = "remote-gemma"  # What the host serves tests/fixtures/presets/tiny-gemma as.


@pytest.fixture(scope="module")
def faulty() -> Iterator[tuple[FaultyServer, str]]:
    server = FaultyServer()
    with serve_in_thread(server.app) as url:
        yield server, url


@pytest.fixture(scope="module")
def keras_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("model-host") / "host.log"
    with keras_hub_host({REMOTE: PRESETS_DIR / "tiny-gemma"}, log) as url:
        yield url


def client(url: str, model: str, **fields: Any) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(Endpoint(base_url=url, served_model=model, context_tokens=2048, **fields))


def local_tiny_gemma() -> LocalEngineClient:
    """tiny-gemma in this process, with the spec its roster entry in the battle tests gets."""
    llm = LLM(name="tiny-gemma", family="gemma", preset=str(PRESETS_DIR / "tiny-gemma"))
    return LocalEngineClient(services.model_spec(llm))


# --- The arena's own host behind HTTP ---------------------------------------------------------


def test_the_host_streams_token_for_token_what_the_engine_writes_in_process(keras_host: str) -> None:
    expected = local_tiny_gemma().submit(SYSTEM, CONVERSATION, max_new_tokens=24, sampling=GREEDY)
    expected_text = expected.result(timeout=60)
    assert expected_text
    # Messages the host renders with the model's template, and a prompt the arena renders itself.
    for remote in (
        client(keras_host, REMOTE),
        client(keras_host, REMOTE, server_applies_template=False, family="gemma"),
    ):
        generation = remote.submit(SYSTEM, CONVERSATION, max_new_tokens=24, sampling=GREEDY)
        deltas = list(generation.deltas(tick=0.5))
        assert "".join(d for d in deltas if d) == generation.text == expected_text
        assert generation.stats.tokens == expected.stats.tokens
        assert generation.stop_reason == expected.stop_reason
        assert generation.stats.ttft_s is not None
    assert client(keras_host, REMOTE).served_models() == {REMOTE: 2048}


def test_the_host_refuses_bad_requests_with_openai_errors(keras_host: str) -> None:
    import httpx

    url = f"{keras_host}/chat/completions"
    cases = [
        ({"model": REMOTE, "messages": []}, 400, "messages must be a non-empty list"),
        ({"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist here"),
        ({"model": REMOTE, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "number"),
        ({"model": REMOTE, "messages": [{"role": "robot", "content": "hi"}]}, 400, "role must be one of"),
        ({"model": REMOTE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400, "max_tokens"),
        ({"model": REMOTE, "messages": [{"role": "assistant", "content": "hi"}]}, 400, "last message"),
    ]
    for body, status, words in cases:
        response = httpx.post(url, json=body, timeout=10)
        assert response.status_code == status, body
        assert words in response.json()["error"]["message"]
    assert httpx.post(url, content=b"{", timeout=10).json()["error"]["message"] == "The request body is not JSON."
    assert httpx.post(url, content=b" " * (2 * 1024 * 1024), timeout=10).status_code == 413


def test_a_client_that_leaves_frees_the_hosts_slot(keras_host: str) -> None:
    remote = client(keras_host, REMOTE)
    sampled = Sampling(temperature=0.05, seed=3)  # tiny-gemma then writes to its limit.
    generation = remote.submit(SYSTEM, CONVERSATION, max_new_tokens=400, sampling=sampled)
    next(delta for delta in generation.deltas(tick=0.5) if delta)
    assert host_health(keras_host)["models"][REMOTE]["active"] == 1
    generation.cancel()
    for _ in generation.deltas(tick=0.5):  # Whatever came before the cancel; then the end.
        pass
    assert generation.stop_reason == "cancelled"
    deadline = time.monotonic() + 10
    while host_health(keras_host)["models"][REMOTE]["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_health(keras_host)["models"][REMOTE]["active"] == 0


# --- A model server that fails ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("http-500", 'answered HTTP 500: {"error":{"message":"out of memory"}}'),
        ("http-400", "answered HTTP 400"),
        ("not-a-stream", "did not answer with a stream"),
        ("malformed", "an event that is not JSON: {not json"),
        ("not-an-object", "choices are not a list of objects"),
        ("cut-short", "stream ended before the reply did"),
        ("error-event", 'reported an error: {"message": "the engine died"'),
        ("redirect", "redirected the request (HTTP 307); not followed"),
    ],
)
def test_each_failure_of_the_server_is_a_clear_error_that_keeps_the_text_written(
    faulty: tuple[FaultyServer, str], fault: str, words: str
) -> None:
    _, url = faulty
    generation = client(url, fault).submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY)
    with pytest.raises(EndpointError) as raised:
        list(generation.deltas(tick=0.5))
    assert words in str(raised.value)
    assert generation.stop_reason == "error"
    if fault in ("malformed", "not-an-object", "cut-short", "error-event"):
        assert generation.text == "Written before."


def test_a_silent_or_endless_server_is_cut_off(faulty: tuple[FaultyServer, str]) -> None:
    _, url = faulty
    silent = client(url, "slow", read_timeout_s=0.5).submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY)
    with pytest.raises(EndpointError, match=r"sent nothing for 0.5 s"):
        silent.result(timeout=20)
    assert silent.text == "Written before."
    endless = client(url, "endless-line", max_response_bytes=256 * 1024)
    generation = endless.submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY)
    with pytest.raises(EndpointError, match=r"passed 262144 bytes; the reply was cut"):
        generation.result(timeout=20)


def test_a_server_that_is_down_is_named_as_unreachable() -> None:
    down = client(f"http://127.0.0.1:{free_port()}/v1", "any")
    with pytest.raises(EndpointError, match=r"could not be reached \(ConnectError\)"):
        down.submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY).result(timeout=20)
    with pytest.raises(EndpointError, match="could not be reached"):
        down.served_models()


def test_stop_while_the_server_is_silent_ends_at_once(faulty: tuple[FaultyServer, str]) -> None:
    _, url = faulty
    generation = client(url, "slow").submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY)
    while generation.text != "Written before.":
        next(generation.deltas(tick=0.1))
    started = time.monotonic()
    generation.cancel()
    assert generation.result(timeout=5) == "Written before."
    assert generation.stop_reason == "cancelled" and time.monotonic() - started < 5


def test_the_key_goes_to_the_server_only(faulty: tuple[FaultyServer, str], caplog: pytest.LogCaptureFixture) -> None:
    server, url = faulty
    key = "sk-test-0123456789"
    keyed = client(url, "auth-echo", api_key=key)
    assert key not in repr(keyed.endpoint)
    assert keyed.submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY).result(timeout=20).endswith(key)
    assert server.seen_authorization == f"Bearer {key}"
    with caplog.at_level(logging.DEBUG):
        for fault in ("http-500", "auth-error"):  # The second quotes the key back in its error.
            failing = client(url, fault, api_key=key).submit(SYSTEM, CONVERSATION, max_new_tokens=8, sampling=GREEDY)
            with pytest.raises(EndpointError) as raised:
                failing.result(timeout=20)
            assert key not in str(raised.value)
            logging.getLogger("test").error("failed: %s", raised.value)
    assert 'answered HTTP 401: {"error":{"message":"bad key: Bearer [the API key]"}}' in str(raised.value)
    assert key not in caplog.text


# --- In the arena -----------------------------------------------------------------------------


@pytest.fixture
def remote_llm(demo_llms: list[LLM], keras_host: str, run_id: str) -> LLM:
    """tiny-gemma served by the keras-hub host over HTTP, on a queue the suite's worker takes."""
    return LLM.objects.create(
        name=REMOTE,
        family="gemma",
        endpoint_url=keras_host,
        served_model=REMOTE,
        context_tokens=2048,
        queue=f"test-{run_id}.tiny-llama3",
        max_new_tokens=24,
        temperature=0.0,
    )


@pytest.mark.django_db(transaction=True)
async def test_a_battle_against_an_endpoint_model_streams_what_the_arenas_own_engine_writes(
    connect_battle: Any, demo_llms: list[LLM], remote_llm: LLM, celery_worker: Any
) -> None:
    def greedy_local() -> None:
        LLM.objects.filter(name="tiny-gemma").update(temperature=0.0, max_new_tokens=24)

    await database_sync_to_async(greedy_local)()
    page = await connect_battle()
    await page.send({"type": "start", "mode": "named", "models": ["tiny-gemma", REMOTE]})
    state = (await page.receive_until(lambda f: f["type"] in ("state", "error")))[-1]
    assert state["type"] == "state", state
    await page.send({"type": "prompt", "text": CONVERSATION[0].content})
    await page.receive_both_ends()
    ends = {f["side"]: f for f in page.frames if f["type"] == "end"}
    assert {end["status"] for end in ends.values()} == {"done"}
    by_model = {state["models"][side]: end["text"] for side, end in ends.items()}
    assert by_model[REMOTE] == by_model["tiny-gemma"] != ""
    for side, end in ends.items():  # Streamed in numbered deltas, the end's text their sum.
        deltas = [f for f in page.frames if f["type"] == "delta" and f["side"] == side]
        assert deltas and "".join(d["text"] for d in deltas) == end["text"]

    replies = await database_sync_to_async(
        lambda: {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)}
    )()
    assert {replies[side].content for side in "ab"} == {by_model[REMOTE]}
    assert all(replies[side].token_count > 0 for side in "ab")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fault", "written"),
    [
        ("down", ""),
        ("http-500", ""),
        ("http-400", ""),
        ("slow", "Written before."),  # then silent past the read timeout
        ("malformed", "Written before."),  # then an event that is not JSON
    ],
)
async def test_an_endpoint_that_fails_fails_its_side_with_retry_and_loses_nothing(
    connect_battle: Any,
    demo_llms: list[LLM],
    remote_llm: LLM,
    faulty: tuple[FaultyServer, str],
    celery_worker: Any,
    settings: Any,
    fault: str,
    written: str,
) -> None:
    settings.ARENA_ENDPOINT_READ_TIMEOUT_SECONDS = 1.0

    def point_at_the_fault() -> None:
        url = f"http://127.0.0.1:{free_port()}/v1" if fault == "down" else faulty[1]
        LLM.objects.filter(pk=remote_llm.pk).update(endpoint_url=url, served_model=fault)

    await database_sync_to_async(point_at_the_fault)()
    page = await connect_battle()
    await page.send({"type": "start", "mode": "named", "models": ["tiny-gemma", REMOTE]})
    state = (await page.receive_until(lambda f: f["type"] in ("state", "error")))[-1]
    await page.send({"type": "prompt", "text": CONVERSATION[0].content})
    await page.receive_both_ends()
    ends = {state["models"][f["side"]]: f for f in page.frames if f["type"] == "end"}
    assert ends["tiny-gemma"]["status"] == "done" and ends["tiny-gemma"]["text"]
    assert ends[REMOTE]["status"] == "failed"
    assert ends[REMOTE]["error"] == generation.NOT_GENERATED  # Nothing about the endpoint reaches the voter.
    assert ends[REMOTE]["text"] == written  # What the server wrote before it failed is kept.

    def reply_of(name: str) -> Message:
        return Message.objects.get(
            role=Message.Role.ASSISTANT, side=next(s for s, n in state["models"].items() if n == name)
        )

    failed = await database_sync_to_async(reply_of)(REMOTE)
    assert (failed.status, failed.content) == (Message.Status.FAILED, written)
    kept = await database_sync_to_async(reply_of)("tiny-gemma")
    assert kept.content == ends["tiny-gemma"]["text"]

    # Retry: the side starts over (and fails again, the server being what it is); the other
    # side's reply stays as it was.
    remote_side = next(s for s, n in state["models"].items() if n == REMOTE)
    await page.send({"type": "regenerate", "side": remote_side})
    await page.receive_until(lambda f: f["type"] == "regenerating" and f["side"] == remote_side)
    again = (await page.receive_until(lambda f: f["type"] == "end" and f["side"] == remote_side))[-1]
    assert again["status"] == "failed" and again["error"] == generation.NOT_GENERATED
    assert (await database_sync_to_async(reply_of)("tiny-gemma")).content == kept.content


# --- The roster ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_add_endpoint_model_asks_the_server_and_takes_its_context(keras_host: str, monkeypatch: Any) -> None:
    out = StringIO()
    call_command(
        "add_endpoint_model", "served-gemma", "--url", keras_host, "--served-model", REMOTE,
        "--api-key-env", "REMOTE_API_KEY", "--family", "gemma", stdout=out,
    )  # fmt: skip
    model = LLM.objects.get(name="served-gemma")
    assert model.served_elsewhere and model.context_tokens == 2048 and model.api_key_env == "REMOTE_API_KEY"
    assert model.queue == settings.ARENA_ENDPOINT_QUEUE and model.preset == ""
    assert f"Added served-gemma: served by {keras_host} as '{REMOTE}', 2,048-token context" in out.getvalue()
    monkeypatch.setenv("REMOTE_API_KEY", "sk-from-the-environment")
    assert services.endpoint(model).api_key == "sk-from-the-environment"

    with pytest.raises(CommandError, match=r"does not serve 'ghost' \(it serves: remote-gemma\)"):
        call_command("add_endpoint_model", "ghost", "--url", keras_host, "--served-model", "ghost")
    with pytest.raises(CommandError, match="could not be reached"):
        call_command("add_endpoint_model", "x", "--url", f"http://127.0.0.1:{free_port()}/v1", "--served-model", "x")
    with pytest.raises(CommandError, match=r'api_key_env: .*ending in "_API_KEY"'):
        call_command(
            "add_endpoint_model", "x", "--url", keras_host, "--served-model", REMOTE, "--api-key-env", "SECRET_KEY"
        )
    with pytest.raises(CommandError, match="endpoint_url: Enter a valid URL"):
        call_command("add_endpoint_model", "x", "--url", "ftp://example.org/v1", "--served-model", REMOTE)
    with pytest.raises(CommandError, match="context_tokens: A model served elsewhere needs its context length"):
        call_command("add_endpoint_model", "x", "--url", keras_host, "--served-model", REMOTE, "--no-check")
    with pytest.raises(CommandError, match="family: The arena renders this model's prompt"):
        call_command(
            "add_endpoint_model", "x", "--url", keras_host, "--served-model", REMOTE, "--arena-template",
            "--context-tokens", "2048", "--no-check",
        )  # fmt: skip
    with pytest.raises(CommandError, match="is hosted by the arena"):
        LLM.objects.create(name="hosted", family="gemma", preset=str(PRESETS_DIR / "tiny-gemma"))
        call_command("add_endpoint_model", "hosted", "--url", keras_host, "--served-model", REMOTE)
    assert set(LLM.objects.values_list("name", flat=True)) == {"served-gemma", "hosted"}


@pytest.mark.django_db
def test_inference_hosts_leave_endpoint_models_to_their_servers(remote_llm: LLM) -> None:
    from inference import selectors

    assert REMOTE not in {model.name for model in selectors.models_for_host()}
    with pytest.raises(ValueError, match="served by its endpoint"):
        selectors.models_for_host(names=[REMOTE])
