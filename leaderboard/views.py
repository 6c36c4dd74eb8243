from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from leaderboard.selectors import leaderboard_rows


def leaderboard(request: HttpRequest) -> HttpResponse:
    return render(request, "leaderboard/index.html", {"rows": leaderboard_rows()})
