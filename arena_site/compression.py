"""Responses compressed for the browser: pages, JSON, CSS, JavaScript and SVG.

Django's GZipMiddleware, kept to text: the research dumps are gzip files already and go as they
are. It masks the BREACH attack on pages that carry a CSRF token (Django adds random bytes to
the compressed length), and covers the embedded mode, where static files are served by WhiteNoise
straight from the apps' folders (WHITENOISE_USE_FINDERS) without the compressed copies that
collectstatic writes for production.
"""

from django.http import HttpRequest, HttpResponseBase
from django.middleware.gzip import GZipMiddleware

COMPRESSIBLE = ("text/", "application/json", "application/javascript", "image/svg+xml")


class TextGZipMiddleware(GZipMiddleware):
    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not response.get("Content-Type", "").startswith(COMPRESSIBLE):
            return response
        return super().process_response(request, response)
