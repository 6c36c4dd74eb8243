"""handler404: the API answers JSON even for a path it does not have (a client parsing its
errors never gets an HTML page); every other path gets the site's 404 page."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)
