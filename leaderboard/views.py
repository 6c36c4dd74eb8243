import itertools

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from leaderboard import charts, selectors, services, wording

# A battle is kept out when its voter knew the names: a reply named its model (an identity leak)
# or the voter picked the models (named mode, direct chat). Both are stored as excluded battles.
LEFT_OUT_LABELS = {"identity leak": "names known: a reply named its model, or the voter picked the models"}


def leaderboard(request: HttpRequest) -> HttpResponse:
    """The latest refresh (or ``?refresh=<id>``: the leaderboard as of then), one category at a
    time (``?category=``)."""
    refresh_id = request.GET.get("refresh")
    if refresh_id:
        if not refresh_id.isdigit() or (refresh := selectors.refresh_by_id(int(refresh_id))) is None:
            raise Http404("No such leaderboard refresh.")
    else:
        refresh = selectors.latest_refresh()
        # Embedded mode has no beat: the page refreshes when due. No refresh at all yet: now.
        if refresh is None or settings.GENERATION_BACKEND != "celery":
            refresh = services.refresh_if_due() or refresh or services.refresh_leaderboard()
    snapshots = list(refresh.snapshots.order_by("position"))
    wanted = request.GET.get("category", "overall")
    snapshot = next((s for s in snapshots if s.category == wanted), None)
    if snapshot is None:
        raise Http404("No such leaderboard category.")
    # Style control (overall board): the toggle shows the ratings at equal style instead.
    styled = request.GET.get("style") == "1" and bool(snapshot.style_rows)
    context = {
        "refresh": refresh,
        "latest": refresh_id is None,
        "refreshes": selectors.recent_refreshes(),
        "snapshots": snapshots,
        "snapshot": snapshot,
        "interval_chart": charts.interval_chart(snapshot.style_rows if styled else snapshot.rows),
        "styled": styled,
        "rows": _with_next_model(snapshot.style_rows if styled else snapshot.rows),
        "win_map": charts.heatmap(snapshot.model_names, snapshot.win_fractions, kind="fraction"),
        "count_map": charts.heatmap(snapshot.model_names, snapshot.battle_counts, kind="count"),
        "excluded_total": sum(snapshot.excluded.values()),
        "left_out": [
            (LEFT_OUT_LABELS.get(reason, reason), count) for reason, count in snapshot.excluded.items() if count
        ],
        "base_models": selectors.base_model_names(),
        "provisional_below": settings.LEADERBOARD_PROVISIONAL_VOTES,
        # When a vote shows: the refresh rule of leaderboard.services.refresh_if_due.
        "refresh_minutes": round(settings.LEADERBOARD_REFRESH_SECONDS / 60),
        "refresh_votes": settings.LEADERBOARD_REFRESH_VOTES,
        "idle_minutes": round(settings.ARENA_BATTLE_IDLE_SECONDS / 60),
        "groups": wording.group_notes(
            snapshot.style_rows if styled else snapshot.rows, fixing=snapshot.method == "fix-ability"
        ),
        "headline": wording.headline(
            snapshot.style_rows if styled else snapshot.rows,
            measure="fix-ability" if snapshot.method == "fix-ability" else "rating",
            evidence="fix episodes" if snapshot.method == "fix-ability" else "votes",
        ),
    }
    return render(request, "leaderboard/index.html", context)


def _with_next_model(rows: list[dict]) -> list[dict]:
    """Each row with the name of the row below it: what its "votes to swap" count swaps it with."""
    return [{**row, "next_model": below["model"]} for row, below in itertools.pairwise(rows)] + rows[-1:]
