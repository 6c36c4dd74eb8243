"""File responses streamed a chunk at a time under ASGI.

Django serves a streaming response whose content is a plain (synchronous) iterator, as
WhiteNoise's static files and the research dumps are, by reading it into a list first
(``StreamingHttpResponse.__aiter__``): every request of a 3.3 MB file held the whole file in
daphne's memory until its client had read it. This middleware, outermost of those that touch a
response's body, gives such a ``FileResponse`` (under ASGI) an asynchronous iterator that pulls
its content a chunk at a time (``FileResponse.block_size`` of the file, compressed by then where
the compression applies), only when the previous chunk has been handed to the server, which,
under daphne, waits while the client does not read (``arena_site.backpressure``). Under WSGI
nothing changes.

It sits outside the compression on purpose: Django compresses an asynchronous stream chunk by
chunk, each a gzip stream of its own, and browsers read only the first of them (a 27 KB script
arrived as its first 8 KB); a synchronous stream it compresses as one.

Only file responses are pulled this way, in the event loop: their chunks come from a local file
(and the compressor) in microseconds. A streaming response that queries the database as it goes
is left to Django, which reads it in a thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, HttpResponseBase


async def pulled_one_at_a_time(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def streamed_a_chunk_at_a_time(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """``response`` with its file pulled a chunk at a time when served under ASGI (as is)."""
    if isinstance(request, ASGIRequest) and isinstance(response, FileResponse) and not response.is_async:
        # The file's close is among the response's closers already: it runs when the server
        # closes the response.
        response.streaming_content = pulled_one_at_a_time(response.streaming_content)
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
