"""File responses streamed a chunk at a time under ASGI.

Django serves a streaming response whose content is a plain (synchronous) iterator, as
WhiteNoise's static files and the research dumps are, by reading it into a list first
(``StreamingHttpResponse.__aiter__``): every request of a 3.3 MB file held the whole file in
daphne's memory until its client had read it. This middleware, between the compression and
WhiteNoise, gives such a ``FileResponse`` (under ASGI) an asynchronous iterator that reads the file
``CHUNK_BYTES`` at a time, only when the response's previous chunk
has been handed to the server (which, under daphne, waits while the client does not read:
``arena_site.backpressure``). Under WSGI nothing changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, HttpResponseBase

# A quarter of what Twisted buffers for a client before it pauses the response (64 KiB).
CHUNK_BYTES = 8 * 1024


async def read_in_chunks(file: IO[bytes], size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
    # Read in the event loop: a chunk of a local file (static files, dumps) takes microseconds,
    # less than handing it to a thread would, and no thread's allocator keeps the chunks.
    while chunk := file.read(size):
        yield chunk


def streamed_a_chunk_at_a_time(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """``response`` with its file read a chunk at a time when served under ASGI (as is)."""
    if (
        isinstance(request, ASGIRequest)
        and isinstance(response, FileResponse)
        and not response.is_async
        and response.file_to_stream is not None
    ):
        # The file's close is among the response's closers already: it runs when the server
        # closes the response.
        response.streaming_content = read_in_chunks(response.file_to_stream)
    return response


class AsyncFileStreamingMiddleware:
    """WhiteNoise is synchronous, so Django runs this middleware synchronously too under ASGI;
    the asynchronous iterator it sets is read by Django's ASGI handler all the same."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self._async_call(request)
        return streamed_a_chunk_at_a_time(request, self.get_response(request))

    async def _async_call(self, request: HttpRequest) -> HttpResponseBase:
        return streamed_a_chunk_at_a_time(request, await self.get_response(request))
