from django.contrib import admin
from django.urls import include, path

from arena_site.api import api, redoc
from arena_site.health import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("api/v1/redoc", redoc, name="api-redoc"),
    path("api/v1/", api.urls),
    path("leaderboard/", include("leaderboard.urls")),
    path("", include("votes.urls")),
]

handler404 = "arena_site.not_found.not_found"
handler500 = "arena_site.unavailable.server_error"
