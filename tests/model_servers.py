"""Real HTTP model servers for the endpoint tests: the arena's own keras-hub host in a child
process, and a server that misbehaves in every way a model server can (down, slow, HTTP errors,
malformed events, a stream cut short, redirects, an answer without end), chosen by the "model"
a request names."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from inference.hosts.openai_server import host_process

FAULTS = (
    "ok",
    "http-500",
    "http-400",
    "not-a-stream",
    "malformed",
    "not-an-object",
    "cut-short",
    "error-event",
    "slow",
    "endless-line",
    "redirect",
    "auth-echo",
    "auth-error",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _event(data: object) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def _chunk(text: str | None = None, finish: str | None = None) -> dict[str, object]:
    delta = {} if text is None else {"content": text}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class FaultyServer:
    """The misbehaving OpenAI-compatible server; ``seen_authorization`` keeps the last key sent."""

    def __init__(self) -> None:
        self.seen_authorization: str | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ]
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": fault, "object": "model"} for fault in FAULTS]})

    async def chat(self, request: Request) -> Response:
        self.seen_authorization = request.headers.get("authorization")
        fault = (await request.json())["model"]
        if fault == "http-500":
            return JSONResponse({"error": {"message": "out of memory"}}, status_code=500)
        if fault == "auth-error":  # A server that quotes the key it was sent.
            return JSONResponse({"error": {"message": f"bad key: {self.seen_authorization}"}}, status_code=401)
        if fault == "http-400":
            return JSONResponse({"error": {"message": "max_tokens is too large"}}, status_code=400)
        if fault == "not-a-stream":
            return JSONResponse({"choices": [{"message": {"content": "whole"}}]})
        if fault == "redirect":
            return RedirectResponse("http://127.0.0.1:9/v1/chat/completions", status_code=307)
        return StreamingResponse(self.stream(fault, self.seen_authorization or ""), media_type="text/event-stream")

    async def stream(self, fault: str, authorization: str) -> AsyncIterator[bytes]:
        yield _event(_chunk("Written "))
        yield _event(_chunk("before."))
        if fault == "malformed":
            yield b"data: {not json\n\n"
        elif fault == "not-an-object":
            yield _event({"choices": "many"})
        elif fault == "error-event":
            yield _event({"error": {"message": "the engine died", "code": 500}})
        elif fault == "slow":
            await asyncio.sleep(30)
        elif fault == "endless-line":
            for _ in range(10_000):
                yield b"x" * 4096
        elif fault == "cut-short":
            return
        else:
            if fault == "auth-echo":
                yield _event(_chunk(f" {authorization}"))
            yield _event(_chunk(None, "stop"))
            yield _event("[DONE]")


@contextmanager
def serve_in_thread(app: Starlette) -> Iterator[str]:
    """``app`` on a loopback port of its own, on uvicorn in a thread: its API root."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def keras_hub_host(models: dict[str, Path], log: Path) -> Iterator[str]:
    """The arena's own host serving ``models`` (name -> preset) in a child process, its shapes
    compiled at their first use: its API root."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    with host_process(models, log, slots=4, compile_all=False) as url:
        yield url


def host_health(base_url: str) -> dict[str, object]:
    return httpx.get(base_url.removesuffix("/v1") + "/health", timeout=5).json()
