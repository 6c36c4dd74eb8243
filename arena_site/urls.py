from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from arena_site.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    # ReDoc is gone: its page needs inline script and styles and fetches a logo from a CDN, which
    # the Content-Security-Policy refuses. Swagger UI (/api/v1/docs) shows the same schema.
    path("api/v1/redoc", RedirectView.as_view(url="/api/v1/docs", permanent=True)),
    path("api/v1/", api.urls),
    path("leaderboard/", include("leaderboard.urls")),
    path("", include("votes.urls")),
]

handler404 = "arena_site.not_found.not_found"
handler500 = "arena_site.unavailable.server_error"
