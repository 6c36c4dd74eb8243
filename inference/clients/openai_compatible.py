"""A client of any OpenAI-compatible model server: vLLM (GPU, or its TPU backend serving
keras-hub presets), the arena's own ``run_inference_host --serve``, llama.cpp's server, hosted
APIs. Plain module: no Django, no JAX.

A reply is one streamed request: ``POST {base_url}/chat/completions`` with the conversation's
messages when the server applies the model's chat template, or ``POST {base_url}/completions``
with the prompt the arena renders itself (``inference.chat_templates``) when it does not. The
stream's server-sent events are read by httpx (``httpx.AsyncClient``) and httpx-sse on one
event loop thread shared by every reply of the process; the reply (``ModelReply``) reads the text
from a queue, as it reads the arena's own engine. Cancelling a reply cancels its task: the
connection closes, which is how vLLM and other servers learn to free the request.

The server's answer is untrusted input: each reply's response is capped in bytes
(``max_response_bytes``), every read in time (``read_timeout_s``), redirects are not followed,
and anything that is not a stream of JSON chunks fails the reply with an ``EndpointError`` whose
message names what was wrong, never the API key.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
from httpx_sse import EventSource, SSEError

from inference import chat_templates, context_budget
from inference.chat_templates import ChatTurn
from inference.clients.base import Sampling, StopReason
from inference.streaming import DeltaQueue, GenerationStats

# What a server's error body may show in a message (its first characters): enough to say why.
ERROR_BODY_CHARS = 300


class EndpointError(RuntimeError):
    """The model server could not be reached, refused the request or answered something that is
    not a completion stream. The message is safe to log and never holds the API key."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how one model is served."""

    base_url: str  # The API's root, e.g. "http://127.0.0.1:8000/v1".
    served_model: str  # The "model" the server knows it by.
    context_tokens: int
    api_key: str | None = field(default=None, repr=False)
    # True: send messages, the server applies the model's chat template. False: the arena renders
    # the prompt with ``family``'s template and sends it as a plain completion.
    server_applies_template: bool = True
    family: str = ""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0  # The longest silence between two pieces of the stream.
    max_response_bytes: int = 2 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"An endpoint's URL starts with http:// or https://; got {self.base_url!r}.")
        if not self.served_model:
            raise ValueError("An endpoint needs the name its server serves the model under.")
        if not self.server_applies_template and self.family not in chat_templates.FAMILIES:
            raise ValueError(
                "An endpoint whose server does not apply the chat template needs the arena's template family "
                f"(one of {', '.join(chat_templates.FAMILIES)}); got {self.family!r}."
            )

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


class OpenAICompatibleClient:
    """One roster model served by an OpenAI-compatible server (``inference.clients.base.ModelClient``)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    @property
    def context_length(self) -> int:
        return self.endpoint.context_tokens

    def prompt_tokens(self, system: str | None, turns: Sequence[ChatTurn]) -> int:
        """The arena's own bound (``inference.context_budget``): the server's tokenizer is not here."""
        return context_budget.conversation_size(system, [turn.content for turn in turns])

    def request_body(
        self, system: str | None, turns: Sequence[ChatTurn], *, max_new_tokens: int, sampling: Sampling
    ) -> tuple[str, dict[str, Any]]:
        """The path and JSON body of this reply's request."""
        endpoint = self.endpoint
        body: dict[str, Any] = {
            "model": endpoint.served_model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed % 2**63,
        }
        if sampling.top_k:  # Not OpenAI's own parameter; vLLM and llama.cpp take it.
            body["top_k"] = sampling.top_k
        if endpoint.server_applies_template:
            # The system message is always sent when there is one; without one, some templates
            # insert their own, which names the model (SmolLM2's does).
            messages = [{"role": "system", "content": system}] if system else []
            messages += [{"role": turn.role, "content": turn.content} for turn in turns]
            return "chat/completions", {**body, "messages": messages}
        prompt = chat_templates.render_prompt(endpoint.family, system, turns)
        return "completions", {**body, "prompt": prompt, "stop": list(chat_templates.stop_strings(endpoint.family))}

    def submit(
        self,
        system: str | None,
        turns: Sequence[ChatTurn],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        background: bool = False,
    ) -> StreamedGeneration:
        """``background`` is not sent: the server schedules its requests itself (vLLM refuses a
        ``priority`` unless it was started with ``--scheduling-policy priority``)."""
        if not turns:
            raise ValueError("The conversation is empty.")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
        path, body = self.request_body(system, turns, max_new_tokens=max_new_tokens, sampling=sampling)
        generation = StreamedGeneration(self.endpoint, path, body)
        generation.start()
        return generation

    def served_models(self) -> dict[str, int | None]:
        """The models the server serves (``GET /models``) and each one's context length where the
        server says it (vLLM's ``max_model_len``): also a check that it answers."""
        try:
            return _loop().run(_served_models(self.endpoint))
        except EndpointError as error:
            raise _redacted(self.endpoint, error) from None


class StreamedGeneration(DeltaQueue):
    """One reply streamed from the server (``inference.clients.base.Generation``)."""

    def __init__(self, endpoint: Endpoint, path: str, body: dict[str, Any]) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.path = path
        self.body = body
        self.stop_reason: StopReason | None = None
        self.stats = GenerationStats()
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None  # Set on the loop thread when the reply starts.
        self._cancel_requested = False
        self._submitted = time.perf_counter()

    def start(self) -> None:
        _loop().spawn(self._run())

    def cancel(self) -> None:
        self._cancel_requested = True
        _loop().loop.call_soon_threadsafe(self._cancel_on_loop)

    def _failure(self) -> BaseException | None:
        return self.error if self.stop_reason == "error" else None

    # --- On the event loop thread -----------------------------------------------------------

    def _cancel_on_loop(self) -> None:
        # Ordered with _run's start on the loop: a task not started yet sees the flag instead.
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        reason: StopReason = "stop"
        error: BaseException | None = None
        try:
            if self._cancel_requested:
                raise asyncio.CancelledError
            reason = await self._stream()
        except asyncio.CancelledError:
            reason = "cancelled"
        except EndpointError as failure:
            reason, error = "error", failure
        except (httpx.HTTPError, SSEError) as failure:
            reason, error = "error", EndpointError(_transport_message(self.endpoint, failure))
        except Exception as failure:  # Anything else the answer caused: the reply fails, the loop lives.
            reason, error = "error", EndpointError(f"The model server's answer could not be read: {failure!r}")
        finally:
            self._end(reason, None if error is None else _redacted(self.endpoint, error))

    async def _stream(self) -> StopReason:
        endpoint = self.endpoint
        reason: StopReason = "stop"
        chunks = 0
        complete = False  # [DONE] or a finish reason: a stream cut before either is a failed reply.
        async with _loop().client.stream(
            "POST",
            endpoint.url(self.path),
            json=self.body,
            headers={**endpoint.headers(), "Accept": "text/event-stream"},
            timeout=_timeout(endpoint),
        ) as response:
            await _check_status(endpoint, response)
            async for event in EventSource(cast(httpx.Response, _Capped(response, endpoint))).aiter_sse():
                if event.data.strip() == "[DONE]":
                    complete = True
                    break
                chunk = _json_object(event.data)
                if "error" in chunk:
                    raise EndpointError(f"The model server reported an error: {_short(json.dumps(chunk['error']))}")
                usage = chunk.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    self.stats.tokens = usage["completion_tokens"]
                for choice in _choices(chunk):
                    delta = _choice_text(choice)
                    if delta:
                        chunks += 1
                        self._emit(delta)
                    finish = choice.get("finish_reason")
                    if finish is not None:
                        complete = True
                        reason = "length" if finish == "length" else "stop"
        if not complete:
            raise EndpointError("The model server's stream ended before the reply did (no finish reason, no [DONE]).")
        if not self.stats.tokens:  # A server that reports no usage: each chunk is about a token.
            self.stats.tokens = chunks
        return reason

    def _emit(self, delta: str) -> None:
        if self.stats.ttft_s is None:
            self.stats.ttft_s = time.perf_counter() - self._submitted
        self._put(delta)

    def _end(self, reason: StopReason, error: BaseException | None) -> None:
        self.stop_reason = reason
        self.error = error
        self.stats.duration_s = time.perf_counter() - self._submitted
        self._close()


class _Capped:
    """The response as httpx-sse reads it (its headers and text), failing once the server has
    sent more than the endpoint's cap: a server that never ends a line cannot grow the worker."""

    def __init__(self, response: httpx.Response, endpoint: Endpoint) -> None:
        self.response = response
        self.headers = response.headers
        self.limit = endpoint.max_response_bytes

    async def aiter_text(self) -> AsyncIterator[str]:
        async for text in self.response.aiter_text():
            if self.response.num_bytes_downloaded > self.limit:
                raise EndpointError(f"The model server's answer passed {self.limit} bytes; the reply was cut.")
            yield text


def _redacted(endpoint: Endpoint, error: BaseException) -> EndpointError:
    """The error without the API key, should the server have echoed it into its answer."""
    message = str(error)
    if endpoint.api_key and endpoint.api_key in message:
        return EndpointError(message.replace(endpoint.api_key, "[the API key]"))
    return error if isinstance(error, EndpointError) else EndpointError(message)


def _timeout(endpoint: Endpoint) -> httpx.Timeout:
    return httpx.Timeout(endpoint.read_timeout_s, connect=endpoint.connect_timeout_s)


async def _check_status(endpoint: Endpoint, response: httpx.Response) -> None:
    if response.is_redirect:
        raise EndpointError(f"The model server redirected the request (HTTP {response.status_code}); not followed.")
    if response.status_code >= 400:
        body = b""
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) >= 4 * ERROR_BODY_CHARS:
                break
        raise EndpointError(
            f"The model server answered HTTP {response.status_code}: {_short(body.decode('utf-8', 'replace'))}"
        )


def _json_object(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise EndpointError(f"The model server sent an event that is not JSON: {_short(data)}") from None
    if not isinstance(value, dict):
        raise EndpointError(f"The model server sent an event that is not a JSON object: {_short(data)}")
    return value


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
        raise EndpointError(f"The model server sent a chunk whose choices are not a list of objects: {_short(chunk)}")
    return choices


def _choice_text(choice: dict[str, Any]) -> str:
    """A chat chunk's ``delta.content`` or a completion chunk's ``text``."""
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    if text is not None and not isinstance(text, str):
        raise EndpointError(f"The model server sent text that is not a string: {_short(choice)}")
    return text or ""


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:ERROR_BODY_CHARS] + ("…" if len(text) > ERROR_BODY_CHARS else "")


def _transport_message(endpoint: Endpoint, error: Exception) -> str:
    where = endpoint.base_url
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return f"The model server at {where} could not be reached ({type(error).__name__})."
    if isinstance(error, httpx.TimeoutException):
        return f"The model server at {where} sent nothing for {endpoint.read_timeout_s:g} s ({type(error).__name__})."
    if isinstance(error, SSEError):
        return f"The model server at {where} did not answer with a stream: {error}"
    return f"The connection to the model server at {where} failed ({type(error).__name__}: {error})."


async def _served_models(endpoint: Endpoint) -> dict[str, int | None]:
    try:
        response = await _loop().client.get(
            endpoint.url("models"), headers=endpoint.headers(), timeout=_timeout(endpoint)
        )
    except httpx.HTTPError as error:
        raise EndpointError(_transport_message(endpoint, error)) from None
    await _check_status(endpoint, response)
    try:
        entries = response.json()["data"]
        return {
            str(entry["id"]): entry["max_model_len"] if isinstance(entry.get("max_model_len"), int) else None
            for entry in entries
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        raise EndpointError(f"The model server's model list is not OpenAI's: {_short(response.text)}") from None


class _EventLoop:
    """One event loop thread for every streamed reply of the process, and its HTTP client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="model-endpoints", daemon=True)
        self.thread.start()
        # Created on the loop's own thread (httpx binds its pool to the running loop on use).
        self.client: httpx.AsyncClient = self.run(self._client())

    @staticmethod
    async def _client() -> httpx.AsyncClient:
        # No redirects: an endpoint's answer must not send the request (and its key) elsewhere.
        return httpx.AsyncClient(follow_redirects=False, limits=httpx.Limits(max_connections=256))

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def spawn(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)


_event_loop: _EventLoop | None = None
_event_loop_lock = threading.Lock()


def _loop() -> _EventLoop:
    global _event_loop
    with _event_loop_lock:
        if _event_loop is None:
            _event_loop = _EventLoop()
        return _event_loop
