"""The arena pages. They carry no model names: the websocket brings everything after the vote."""

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from arena_site.addresses import client_address
from inference import warming
from votes import evaluation_services, rate_limits, selectors, services, shutdown


def _session_refused(request: HttpRequest) -> HttpResponse | None:
    """The websocket identifies the voter by the page's session, so it must exist before the
    page loads. A new one is counted against its network's hourly budget (a script fetching the
    page in a loop would otherwise store a session row per request); past it, a 429 that says
    why and when to come back, and nothing stored."""
    if request.session.session_key:
        return None
    wait = rate_limits.new_session(client_address(request))
    if wait is not None:
        response = HttpResponse(
            f"Too many new visitors from your network in the last hour; try again in {wait} s.",
            status=429,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(wait)
        return response
    request.session.save()
    return None


def _fresh_page(request: HttpRequest, mode: str) -> HttpResponse:
    # An embedded arena served by something else than manage.py serve warms at its first page.
    warming.start_embedded(should_stop=shutdown.stopping)
    roster, models = selectors.roster_status(), selectors.chat_models()
    watch = roster.required and not all(state.ready for _, state in models)
    context = {
        "battle_id": "",
        "tasks": selectors.active_tasks(),
        "mode": mode,
        "roster": roster,
        "watch_roster": watch,
        "models": models if mode else [],
    }
    return render(request, "votes/arena.html", context)


def arena(request: HttpRequest) -> HttpResponse:
    """A fresh battle: the models are drawn when the first prompt arrives."""
    if refused := _session_refused(request):
        return refused
    return _fresh_page(request, "")


def named(request: HttpRequest) -> HttpResponse:
    """A fresh side-by-side battle between two models the voter picks (off the leaderboard). The
    anonymous arena's pages never list the models: this one does, by design."""
    if refused := _session_refused(request):
        return refused
    return _fresh_page(request, "named")


def direct(request: HttpRequest) -> HttpResponse:
    """A fresh chat with one model the voter picks."""
    if refused := _session_refused(request):
        return refused
    return _fresh_page(request, "direct")


def roster(request: HttpRequest) -> JsonResponse:
    """How many of the anonymous roster's models are ready, and each enabled model's state (the
    names are public: the named page lists them); the fresh pages poll it while models warm."""
    status = selectors.roster_status()
    return JsonResponse(
        {
            "ready": status.ready,
            "warming": status.warming,
            "total": status.total,
            "needed": status.needed,
            "battles_possible": status.battles_possible,
            "models": [{"name": name, "state": state.state.value} for name, state in selectors.chat_models()],
        }
    )


def share(request: HttpRequest, share_id: str) -> HttpResponse:
    """A revealed battle, read-only, for anyone with the link: conversation, ratings, votes, names."""
    battle = selectors.shared_battle(share_id)
    if battle is None:
        raise Http404("No battle is shared at this address: a battle can be shared once it has ended.")
    return render(request, "votes/share.html", {"battle": battle, "page": selectors.shared_battle_page(battle)})


def battle(request: HttpRequest, public_id: str) -> HttpResponse:
    # No session, no battle of this browser's: answered without creating a session for it.
    session_key = request.session.session_key
    voter_key = services.voter_key_for(session_key) if session_key else None
    if voter_key is None or selectors.battle_for_voter(public_id=public_id, voter_key=voter_key) is None:
        # Battles are private to the browser that played them: another voter's link, or one
        # opened in another browser, lands here, told why.
        raise Http404(
            "This battle is not yours to open: a battle shows only in the browser that played it. "
            "Start a battle of your own."
        )
    return render(request, "votes/arena.html", {"battle_id": public_id})


def evaluation(request: HttpRequest, run_id: int) -> HttpResponse:
    """An evaluation run's three tables and its recap (model names are public here). The texts of
    models in the arena are shown to staff only: anyone else could match a battle against them."""
    run = selectors.evaluation_run(run_id)
    if run is None:
        raise Http404("No such evaluation run.")
    report = selectors.evaluation_report(run, reveal_texts=request.user.is_staff)
    fixability = selectors.evaluation_fixability(run) if run.status == run.Status.DONE else []
    progress = selectors.evaluation_progress(run)
    context = {"report": report, "fixability": fixability, "seconds_left": progress["seconds_left"]}
    return render(request, "votes/evaluation.html", context)


def evaluation_progress(request: HttpRequest, run_id: int) -> JsonResponse:
    """Where a run stands (``selectors.evaluation_progress``): its page polls it while it runs."""
    run = selectors.evaluation_run(run_id)
    if run is None:
        return JsonResponse({"error": "No such evaluation run."}, status=404)
    return JsonResponse(selectors.evaluation_progress(run))


@require_POST
def cancel_evaluation(request: HttpRequest, run_id: int) -> HttpResponse:
    """Staff cancel a waiting or running run from its page (the admin has the same action)."""
    if not request.user.is_staff:
        return HttpResponse("Only staff can cancel an evaluation run.", status=403, content_type="text/plain")
    run = selectors.evaluation_run(run_id)
    if run is None:
        raise Http404("No such evaluation run.")
    if evaluation_services.cancel_evaluation(run):
        messages.success(request, f"Evaluation #{run.pk} cancelled: it stops within seconds and keeps nothing.")
    else:
        messages.warning(request, f"Evaluation #{run.pk} had already ended ({run.get_status_display()}).")
    return HttpResponseRedirect(reverse("votes:evaluation", args=[run.pk]))


def evaluations(request: HttpRequest) -> HttpResponse:
    runs = selectors.recent_evaluation_runs(50)
    return render(request, "votes/evaluations.html", {"runs": runs})
