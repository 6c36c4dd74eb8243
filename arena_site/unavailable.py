"""A database that is down gets a clear 503 (a page, or JSON on the API), never a bare 500.

The middleware turns a view's database outage into the 503; the 500 handler does the same for
an outage met outside a view (a middleware reading the session, say). Every write is one
transaction, so a request that meets the outage has saved nothing.
"""

import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults

MESSAGE = "The arena's database is unavailable right now; nothing was saved. Please try again in a minute."
RETRY_AFTER_SECONDS = 30
OUTAGES = (OperationalError, InterfaceError)


def database_unavailable(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": MESSAGE}, status=503)
    else:
        # No request context: its processors (the user, messages) would need the database.
        response = HttpResponse(render_to_string("503.html", {"message": MESSAGE}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return database_unavailable(request) if isinstance(exception, OUTAGES) else None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: called while the exception is being handled, so sys.exc_info() has it."""
    if isinstance(sys.exc_info()[1], OUTAGES):
        return database_unavailable(request)
    return defaults.server_error(request)
