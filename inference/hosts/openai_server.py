"""The arena's own keras-hub host as an OpenAI-compatible server: the protocol vLLM speaks.

Every model is loaded once into the project's continuous-batching engine (``inference.hosts.engines``:
sharded over the host's devices, the prefix cache), and served over HTTP:

- ``POST /v1/chat/completions``: ``messages`` rendered with the model's own chat template
  (``inference.chat_templates``), streamed as server-sent events with ``"stream": true`` (the
  chunks, a usage chunk when ``stream_options.include_usage`` asks for it, then ``[DONE]``) or
  answered whole;
- ``POST /v1/completions``: a ``prompt`` already rendered, with ``stop`` strings;
- ``GET /v1/models`` (each with its ``max_model_len``) and ``GET /health``.

A client that disconnects cancels its reply: the engine frees its slot at the next dispatch.
Requests are checked (size, fields, types, ranges) and refused with OpenAI's error shape. Starlette
on uvicorn; no Django, no database: ``python -m inference.hosts.openai_server --model NAME=PRESET``,
or ``manage.py run_inference_host --serve`` for the roster's models.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inference.chat_templates import ChatTurn
from inference.clients.base import Generation, Sampling
from inference.hosts import engines
from inference.hosts.engines import ModelSpec

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
ROLES = ("system", "user", "assistant")
# How often a streaming reply looks up whether its client is still there between two tokens.
TICK_S = 0.25


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400, or ``status``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HostedModel:
    """One model this host serves: the name clients ask for and how to load it."""

    spec: ModelSpec
    max_new_tokens: int = 2048  # The most a request may ask for; the context caps it too.


class Host:
    """The models of one host process and their engines (``inference.clients.local``)."""

    def __init__(self, models: Sequence[HostedModel]) -> None:
        if not models:
            raise ValueError("A host serves at least one model.")
        self.models = {model.spec.name: model for model in models}
        self.ready: set[str] = set()

    def warm_up(self, report: Callable[[str], None] = logger.info, *, compile_all: bool = True) -> None:
        """Load every model and (``compile_all``) compile every shape its engine will use, before
        taking traffic; without it, each shape compiles at its first use."""
        for name, model in self.models.items():
            started = time.monotonic()
            engine = engines.warm_up(model.spec) if compile_all else engines.engine_for(model.spec)
            self.ready.add(name)
            report(
                f"{name}: loaded{' and compiled' if compile_all else ''} in {time.monotonic() - started:.1f} s "
                f"({engine.compilations} compilations)"
            )

    def client(self, name: str) -> Any:
        from inference.clients.local import LocalEngineClient

        if name not in self.models:
            raise BadRequest(f"The model {name!r} does not exist here (GET /v1/models lists them).", status=404)
        return LocalEngineClient(self.models[name].spec)


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number.")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low:g} and {high:g}; got {value}.")
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer.")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low} and {high}; got {value}.")
    return value


def parse_sampling(body: dict[str, Any]) -> Sampling:
    temperature = _number(body, "temperature", 1.0, 0.0, 5.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    top_k = _integer(body, "top_k", 0, -1, 1_000_000)
    seed = _integer(body, "seed", 0, -(2**63), 2**64 - 1) % 2**64
    if top_p == 0 or top_k == 1:  # Greedy, as the arena's roster reads these (inference.models.samples).
        temperature = 0.0
    return Sampling(temperature=temperature, top_k=max(top_k, 0), top_p=top_p if top_p > 0 else 1.0, seed=seed)


def parse_messages(body: dict[str, Any]) -> tuple[str | None, list[ChatTurn]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list.")
    system: str | None = None
    turns: list[ChatTurn] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{index}] must be an object.")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRequest(f"messages[{index}].role must be one of {', '.join(ROLES)}.")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{index}].content must be a string.")
        if role == "system":
            if index != 0:
                raise BadRequest("Only the first message may be the system message.")
            system = content
        else:
            turns.append(ChatTurn(role=role, content=content))
    if not turns or turns[-1].role != "user":
        raise BadRequest("The last message must be the user's.")
    return system, turns


def parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(item, str) and item for item in stops) or len(stops) > 8:
        raise BadRequest("stop must be a non-empty string or a list of at most 8 of them.")
    return tuple(stops)


class OpenAIServer:
    """The Starlette application of one host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.app = Starlette(
            routes=[
                Route("/health", self.health),
                Route("/v1/models", self.list_models),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ],
            exception_handlers={BadRequest: self.bad_request},  # type: ignore[dict-item]
        )

    async def health(self, request: Request) -> Response:
        """200 once every model is loaded and compiled (503 before), with each model's replies in
        its decode slots (``active``): what an operator, or a test of Stop, looks at."""
        models = {}
        for name in self.host.models:
            ready = name in self.host.ready
            models[name] = {"ready": ready, "active": self.host.client(name).engine.active_slots if ready else 0}
        everything = all(model["ready"] for model in models.values())
        return JSONResponse({"status": "ok" if everything else "warming", "models": models}, 200 if everything else 503)

    async def list_models(self, request: Request) -> Response:
        data = []
        for name in self.host.models:
            entry: dict[str, Any] = {"id": name, "object": "model", "owned_by": "fix-arena"}
            if name in self.host.ready:
                entry["max_model_len"] = self.host.client(name).context_length
            data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    async def bad_request(self, request: Request, error: BadRequest) -> Response:
        kind = "not_found_error" if error.status == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(error), "type": kind, "code": error.status}}, error.status)

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request)
        system, turns = parse_messages(body)

        def submit(client: Any, max_tokens: int, sampling: Sampling) -> tuple[Generation, int]:
            generation = client.submit(system, turns, max_new_tokens=max_tokens, sampling=sampling)
            return generation, client.prompt_tokens(system, turns)

        return await self.answer(body, "chat.completion", submit)

    async def completions(self, request: Request) -> Response:
        body = await read_json(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadRequest("prompt must be a non-empty string (one prompt per request).")
        stop = parse_stop(body)
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise BadRequest("ignore_eos must be true or false.")

        def submit(client: Any, max_tokens: int, sampling: Sampling) -> tuple[Generation, int]:
            # ignore_eos (vLLM's): no token ends the reply, so that benchmarks get exact lengths.
            generation = client.submit_prompt(
                prompt, max_new_tokens=max_tokens, sampling=sampling, stop_strings=stop, ignore_stop_tokens=ignore_eos
            )
            return generation, client.engine.prompt_tokens(prompt)

        return await self.answer(body, "text_completion", submit)

    async def answer(
        self, body: dict[str, Any], kind: str, submit: Callable[[Any, int, Sampling], tuple[Generation, int]]
    ) -> Response:
        name = body.get("model")
        if not isinstance(name, str):
            raise BadRequest("model must be a string.")
        if name not in self.host.ready and name in self.host.models:
            raise BadRequest(f"The model {name!r} is still loading.", status=503)
        client = self.host.client(name)
        sampling = parse_sampling(body)
        limit = self.host.models[name].max_new_tokens
        max_tokens = _integer(body, "max_tokens", limit, 1, limit)
        if "max_completion_tokens" in body:
            max_tokens = _integer(body, "max_completion_tokens", limit, 1, limit)
        try:
            generation, prompt_tokens = submit(client, max_tokens, sampling)
        except ValueError as error:  # Too long for the context, and the like.
            raise BadRequest(str(error)) from None
        reply_id = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}"
        usage_wanted = isinstance(body.get("stream_options"), dict) and bool(
            body["stream_options"].get("include_usage")
        )
        if body.get("stream"):
            chunks = stream_chunks(generation, reply_id, name, kind, usage=usage_wanted, prompt_tokens=prompt_tokens)
            return StreamingResponse(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-store"})
        try:
            text = await anyio.to_thread.run_sync(_whole, generation, abandon_on_cancel=True)
        finally:
            generation.cancel()  # A no-op once done; frees the slot if the client went away.
        return JSONResponse(whole_answer(generation, text, reply_id, name, kind, prompt_tokens))


def _whole(generation: Generation) -> str:
    return "".join(generation)


def _finish_reason(generation: Generation) -> str:
    return "length" if generation.stop_reason == "length" else "stop"


def _usage(generation: Generation, prompt_tokens: int = 0) -> dict[str, int]:
    tokens = generation.stats.tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}


def _chunk(reply_id: str, model: str, kind: str, text: str | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat.completion":
        delta = {} if text is None else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": reply_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
        }
    choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return {
        "id": reply_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def _event(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream_chunks(
    generation: Generation, reply_id: str, model: str, kind: str, *, usage: bool, prompt_tokens: int = 0
) -> AsyncIterator[bytes]:
    """The reply as server-sent events. Closed early (the client left), it cancels the reply."""
    deltas: Iterator[str] = generation.deltas(tick=TICK_S)
    done = object()
    try:
        if kind == "chat.completion":
            yield _event(
                {
                    **_chunk(reply_id, model, kind, None, None),
                    "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
                }
            )
        while True:
            delta = await anyio.to_thread.run_sync(next, deltas, done)
            if delta is done:
                break
            # Between two tokens a comment line, which clients ignore: a client that left is
            # noticed at the next write, and its reply cancelled, even before the first token.
            yield _event(_chunk(reply_id, model, kind, delta, None)) if delta else b":\n\n"
        yield _event(
            _chunk(reply_id, model, kind, None if kind == "chat.completion" else "", _finish_reason(generation))
        )
        if usage:
            yield _event(
                {
                    "id": reply_id,
                    "object": f"{kind}.chunk" if kind == "chat.completion" else kind,
                    "model": model,
                    "choices": [],
                    "usage": _usage(generation, prompt_tokens),
                }
            )
        yield _event("[DONE]")
    except Exception as error:  # The engine failed mid-reply: say so in the stream, as vLLM does.
        logger.exception("Reply %s failed", reply_id)
        yield _event(
            {"error": {"message": f"The reply failed: {type(error).__name__}", "type": "server_error", "code": 500}}
        )
    finally:
        generation.cancel()


def whole_answer(
    generation: Generation, text: str, reply_id: str, model: str, kind: str, prompt_tokens: int = 0
) -> dict[str, Any]:
    if kind == "chat.completion":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": _finish_reason(generation),
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": _finish_reason(generation)}
    return {
        "id": reply_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(generation, prompt_tokens),
    }


async def read_json(request: Request) -> dict[str, Any]:
    """The request's JSON object, refused past MAX_BODY_BYTES or when it is anything else."""
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise BadRequest(f"The request is over {MAX_BODY_BYTES} bytes.", status=413)
    try:
        value = json.loads(body)
    except ValueError:
        raise BadRequest("The request body is not JSON.") from None
    if not isinstance(value, dict):
        raise BadRequest("The request body must be a JSON object.")
    return value


def parse_model_option(text: str, slots: int) -> HostedModel:
    """ "NAME=PRESET" (the family read from the preset) -> a hosted model."""
    from inference import registry

    name, sep, preset = text.partition("=")
    if not sep or not name or not preset:
        raise argparse.ArgumentTypeError(f"--model takes NAME=PRESET_DIR; got {text!r}.")
    info = registry.read_preset(Path(preset))
    return HostedModel(ModelSpec(name=name, family=info.family, preset=str(Path(preset).resolve()), slots=slots))


@contextmanager
def host_process(
    models: dict[str, Path],
    log: Path,
    *,
    port: int | None = None,
    slots: int = 8,
    compile_all: bool = True,
    timeout_s: float = 600,
) -> Iterator[str]:
    """This module serving ``models`` (name -> preset folder) in a child process, once its
    /health says every model is warm: its API root. Stopped on leaving."""
    import os
    import socket
    import subprocess
    import sys

    import httpx

    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    command = [sys.executable, "-m", "inference.hosts.openai_server", "--port", str(port), "--slots", str(slots)]
    command += [] if compile_all else ["--compile-lazily"]
    for name, preset in models.items():
        command += ["--model", f"{name}={preset}"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"The model host exited ({process.returncode}): {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"The model host was not ready in {timeout_s:g} s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve(host: Host, *, bind: str, port: int, log_level: str = "info", compile_all: bool = True) -> None:
    """Warm every model, then serve until interrupted."""
    import uvicorn

    host.warm_up(compile_all=compile_all)
    # uvicorn stops on SIGTERM or Ctrl-C, then raises the signal again under the handler it found:
    # this one ends the wait, so that the engines can stop before the process exits (status 0).
    previous = {sig: signal.signal(sig, _stop_serving) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(OpenAIServer(host).app, host=bind, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    except _StopServing:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A decode thread may be in an XLA call: leave without finalising under it (engines.still_running).
    if engines.shutdown_all(engines.STOP_TIMEOUT_S):
        logger.info("An engine is still in an XLA call: leaving without waiting for it")
        engines.exit_now(0)


class _StopServing(Exception):
    """The server was asked to stop (SIGTERM, Ctrl-C) and has."""


def _stop_serving(signum: int, frame: object) -> None:
    raise _StopServing


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve keras-hub presets over the OpenAI-compatible protocol.")
    parser.add_argument("--model", action="append", required=True, metavar="NAME=PRESET_DIR")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--slots", type=int, default=8, help="Decode slots of each model's engine.")
    parser.add_argument(
        "--compile-lazily",
        action="store_true",
        help="Load the models but compile each shape at its first use: ready sooner, first replies slower.",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    host = Host([parse_model_option(text, args.slots) for text in args.model])
    serve(host, bind=args.host, port=args.port, compile_all=not args.compile_lazily)


if __name__ == "__main__":
    main()
