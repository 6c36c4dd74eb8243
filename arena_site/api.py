"""The research API (django-ninja) at /api/v1: leaderboard, models, tasks, votes, battles,
evaluation runs and dumps. OpenAPI schema at /api/v1/openapi.json, docs at /api/v1/docs (Swagger
UI, served from django-ninja's own static files).

Without a key: the leaderboard, models, tasks, evaluations and a throttled sample of the newest
votes. With a researcher key (header ``X-API-Key``, issued in the admin): everything, paginated
by cursor, throttled per key.
"""

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.core.cache import cache
from django.http import FileResponse, HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from ninja import Field, NinjaAPI, Query, Schema
from ninja.errors import HttpError, ValidationError

from arena_site.addresses import client_address
from inference.models import LLM
from leaderboard import selectors as leaderboard_selectors
from votes import dumps as dump_store
from votes import research, selectors, services
from votes.models import Battle, ResearcherKey, Task

api = NinjaAPI(
    title="Fix Arena research API",
    version="1",
    description=__doc__ or "",
    urls_namespace="api-1",
)


class Error(Schema):
    detail: str


ERRORS: dict[int, Any] = {401: Error, 403: Error, 422: Error, 429: Error}


@api.exception_handler(ValidationError)
def invalid_request(request: HttpRequest, exc: ValidationError) -> Any:
    messages = "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', [])[1:]) or 'request'}: {error.get('msg')}"
        for error in exc.errors
    )
    return api.create_response(request, {"detail": messages or "Invalid request."}, status=422)


def _throttle(bucket: str, per_minute: int) -> None:
    window = int(timezone.now().timestamp() // 60)
    name = f"api-throttle:{bucket}:{window}"
    cache.add(name, 0, timeout=120)
    try:
        count = cache.incr(name)
    except ValueError:  # Expired between add and incr.
        cache.set(name, 1, timeout=120)
        count = 1
    if count > per_minute:
        raise HttpError(429, f"Too many requests: at most {per_minute} a minute; retry in a minute.")


def _throttle_address(request: HttpRequest) -> None:
    """Spend one of the client address's anonymous requests (keyed by a hash of the address)."""
    _throttle(f"ip:{services.hash_token(client_address(request))}", settings.ARENA_API_ANON_PER_MINUTE)


def researcher(request: HttpRequest) -> ResearcherKey | None:
    """The request's researcher key (and its throttle), or None for an anonymous request."""
    token = request.headers.get("X-API-Key")
    if token is None:
        _throttle_address(request)
        return None
    key = services.researcher_key_for(token)
    if key is None or key.revoked:
        # Guessing keys, or hammering with a revoked one, spends the address's anonymous budget.
        _throttle_address(request)
    if key is None:
        raise HttpError(401, "Unknown API key.")
    if key.revoked:
        raise HttpError(403, "This API key has been revoked.")
    _throttle(f"key:{key.pk}", settings.ARENA_API_KEY_PER_MINUTE)
    return key


def require_key(request: HttpRequest) -> ResearcherKey:
    key = researcher(request)
    if key is None:
        raise HttpError(401, "This needs a researcher API key (header X-API-Key); ask an admin for one.")
    return key


# --- Leaderboard, models, tasks -----------------------------------------------------------------


class LeaderboardRow(Schema):
    """A model's row: vote boards give votes, Elo and fix rates; the fix-ability board
    ("fixing") gives episodes, fixed, and the raw fix rate with its Wilson interval."""

    model: str
    rating: float
    lower: float
    upper: float
    rank: int
    provisional: bool
    votes: int | None = None
    elo: float | None = None
    fix_rate: dict[str, Any] | float | None = None
    checker_fix_rate: dict[str, Any] | None = None
    episodes: int | None = None
    fixed: int | None = None
    fix_lower: float | None = None
    fix_upper: float | None = None


class Leaderboard(Schema):
    refresh_id: int
    refreshed: datetime
    category: str
    title: str
    method: str
    votes: int
    excluded: dict[str, int]
    rows: list[LeaderboardRow]
    style_control: bool = Field(description="Whether rows are the style-controlled ratings (overall, ?style=true).")
    style_coefficients: dict[str, dict[str, float]] = Field(
        description="With style control: each style coefficient {value, lower, upper}, log-odds per unit of difference."
    )
    unrated: list[str] = Field(description="Models without a vote in this category: not yet rated, not ranked.")
    categories: list[str]


@api.get("/leaderboard", response={200: Leaderboard, 404: Error, **ERRORS}, tags=["leaderboard"])
def leaderboard(
    request: HttpRequest, category: str = "overall", refresh: int | None = None, style: bool = False
) -> Any:
    """The latest leaderboard of a category, or the one of an earlier refresh (``refresh``);
    ``style``: the overall board with style control (ratings at equal length and markdown, and
    the style coefficients)."""
    researcher(request)
    found = leaderboard_selectors.refresh_by_id(refresh) if refresh else leaderboard_selectors.latest_refresh()
    if found is None:
        raise HttpError(404, "No such leaderboard refresh." if refresh else "No leaderboard has been computed yet.")
    snapshots = {snapshot.category: snapshot for snapshot in found.snapshots.all()}
    snapshot = snapshots.get(category)
    if snapshot is None:
        raise HttpError(404, f"No category {category!r}; known: {', '.join(snapshots)}.")
    return {
        "refresh_id": found.pk,
        "refreshed": found.created,
        "category": category,
        "title": snapshot.title,
        "method": snapshot.method,
        "votes": snapshot.votes,
        "excluded": snapshot.excluded,
        "rows": snapshot.style_rows if style and snapshot.style_rows else snapshot.rows,
        "style_control": bool(style and snapshot.style_rows),
        "style_coefficients": snapshot.style_coefficients if style else {},
        "unrated": snapshot.unrated,
        "categories": list(snapshots),
    }


class ModelOut(Schema):
    name: str
    family: str
    enabled: bool


@api.get("/models", response={200: list[ModelOut], **ERRORS}, tags=["models and tasks"])
def models(request: HttpRequest) -> Any:
    researcher(request)
    return list(LLM.objects.order_by("name"))


class TaskTurnOut(Schema):
    position: int
    prompt: str
    expected_output: str
    checker: str
    checker_options: dict[str, Any]


class TaskOut(Schema):
    slug: str
    title: str
    category: str
    system_prompt: str
    turns: list[TaskTurnOut]


@api.get("/tasks", response={200: list[TaskOut], **ERRORS}, tags=["models and tasks"])
def tasks(request: HttpRequest) -> Any:
    """The active tasks, with their scripted turns and expected outputs."""
    researcher(request)
    return [
        {
            **{f: getattr(task, f) for f in ("slug", "title", "category", "system_prompt")},
            "turns": list(task.turns.all()),
        }
        for task in Task.objects.active().prefetch_related("turns").order_by("slug")
    ]


# --- Votes -----------------------------------------------------------------------------------------


MAX_PAGE = 10_000


class VoteFilters(Schema):
    format: Literal["jsonl", "csv"] = "jsonl"
    # No NUL in a task category: PostgreSQL text cannot hold one (422 here, not a 500 from the query).
    category: str = Field("overall", pattern=r"^(overall|after_correction|task:[^\x00]+)$")
    include_excluded: bool = False
    # Strings with the date-time format, parsed here: pydantic would also take numbers.
    since: str | None = Field(None, json_schema_extra={"format": "date-time"}, description="Battles ended at or after.")
    until: str | None = Field(None, json_schema_extra={"format": "date-time"}, description="Battles ended before.")
    cursor: int | None = Field(None, ge=0, description="The X-Next-Cursor of the previous page.")
    limit: int | None = Field(None, ge=1, le=MAX_PAGE, description=f"Votes per page (default and most: {MAX_PAGE}).")


# Integer status keys, as ninja's own: a "200" string would be written beside its 200, a duplicate
# key that Swagger UI and ReDoc refuse to parse.
STREAM_DOC = {
    "responses": {
        200: {
            "description": "One record per vote (clean_battle fields plus this arena's): JSON Lines or CSV. "
            "The header X-Next-Cursor, when present, is the cursor of the next page.",
            "content": {
                "application/x-ndjson": {"schema": {"type": "string"}},
                "text/csv": {"schema": {"type": "string"}},
            },
        }
    }
}


@api.get("/votes", response={200: None, **ERRORS}, tags=["votes"], openapi_extra=STREAM_DOC)
def votes(request: HttpRequest, filters: Query[VoteFilters]) -> Any:
    """Votes with their conversations, oldest first, by ``cursor`` (a vote id) pages of ``limit``.

    Without a key: of the newest ``ARENA_API_SAMPLE_SIZE`` counted votes (of any category), those
    the filters select (no cursor): no filter reaches older votes. In this sample the replies of
    models still in the arena (and the checker's reasons, which quote them) are null, and
    ``texts_hidden`` lists those sides: with their names, they would teach a voter to recognise
    the models in fresh battles. Names, votes, verdicts and token counts stay; a key (or a staff
    session) gets every text.
    ``since``/``until`` bound the battle's end; ``category`` is overall (first-try votes),
    after_correction or task:<category>; ``include_excluded`` adds the votes the leaderboard leaves out, each with
    its reason.
    """
    key = researcher(request)
    if key is None and (filters.cursor is not None or filters.include_excluded):
        raise HttpError(401, "Pages and excluded votes need a researcher API key (header X-API-Key).")
    found = research.research_votes(
        category=filters.category,
        include_excluded=filters.include_excluded,
        since=None if filters.since is None else _moment("since", filters.since),
        until=None if filters.until is None else _moment("until", filters.until),
    )
    next_cursor = None
    if key is None:
        sample = settings.ARENA_API_SAMPLE_SIZE
        page = research.anonymous_sample(found, sample, min(filters.limit or sample, sample))
    else:
        page, next_cursor = research.page_after(found, filters.cursor, filters.limit or MAX_PAGE)
    records = research.vote_records(page, with_exclusion=filters.include_excluded)
    if key is None and not request.user.is_staff:  # The public sample: no text of a model in the arena.
        in_arena = selectors.models_in_arena()
        records = (research.without_arena_texts(record, in_arena) for record in records)
    if filters.format == "csv":
        response = StreamingHttpResponse(_csv_lines(records), content_type="text/csv; charset=utf-8")
    else:
        lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    if next_cursor is not None:
        response["X-Next-Cursor"] = str(next_cursor)
    return response


def _moment(name: str, value: str) -> datetime:
    try:
        moment = parse_datetime(value)
    except ValueError:
        moment = None
    if moment is not None:
        try:  # In UTC: the database refuses some odd offsets (-20:16) that ISO 8601 allows.
            return moment.astimezone(UTC) if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
        except (OverflowError, ValueError):
            pass
    raise HttpError(422, f"{name}: an ISO 8601 date-time, e.g. 2026-11-30T12:00:00Z.")


def _csv_lines(records: Iterator[dict[str, Any]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=research.CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for record in records:
        writer.writerow(research.flat_record(record))
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


# --- Battles -------------------------------------------------------------------------------------


class EpisodeOut(Schema):
    episode_id: int
    battle: str | None = Field(description="The live battle; null for an evaluation run's episode.")
    evaluation_run: int | None
    model: str
    mistake_by: str | None = Field(description="Evaluation runs: whose mistake it was, when another model's.")
    task: str
    turn: int = Field(description="The scripted turn the wrong reply answered (0 in free chat): the difficulty cell.")
    wrong_turn: int
    side: str
    attempt: int
    correction: str | None = Field(
        description="What was sent to that side; null for an evaluation run's correction written from the "
        "checker's reason (it quotes the wrong reply) while the model that wrote that reply is in the arena."
    )
    source: str
    feedback_kind: str
    fixed: bool
    turns_to_fix: int | None = Field(description="The corrections this mistake took to be fixed; null: never fixed.")
    regression: bool | None = Field(
        description="The reply broke a part the wrong one had right, judged field by field by the checker; "
        "null where the checker did not judge both replies part by part."
    )
    persisted: bool | None = Field(
        description="The parts it fixed stayed right in that side's later checked replies; null: none to judge."
    )
    voter_fixed: bool | None = Field(
        default=None,
        description="The voter rated the wrong reply 🍄/🔥 and the answer 🥦 or ✓ (true) or not (false); null: "
        "not so rated. The leaderboard's voters' fix rate.",
    )
    checker_fixed: bool | None = Field(
        default=None,
        description="The checker judged the wrong reply wrong and the answer correct (true) or not (false); null: "
        "not so judged. The leaderboard's checker's fix rate.",
    )
    decoy: bool
    excluded: bool
    excluded_reason: str | None


class EpisodePage(Schema):
    episodes: list[EpisodeOut]
    next_cursor: int | None


@api.get("/episodes", response={200: EpisodePage, **ERRORS}, tags=["votes"])
def episodes(
    request: HttpRequest,
    include_excluded: bool = False,
    cursor: int | None = Query(None, ge=0, description="next_cursor of the previous page."),
    limit: int = Query(1000, ge=1, le=MAX_PAGE),
) -> Any:
    """Fix episodes of ended battles and finished evaluation runs, oldest first: a reply judged
    wrong, the correction sent to that side, and whether the reply to it fixed it (as of the last
    leaderboard refresh, which records them). ``manage.py rate_fixes`` rates the ``episodes``
    list as it is."""
    require_key(request)
    page = research.episode_records(include_excluded=include_excluded, after=cursor or 0, limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return {"episodes": page, "next_cursor": page[-1]["episode_id"] if more else None}


class BattlePage(Schema):
    battles: list[dict[str, Any]]
    next_cursor: str | None


@api.get("/battles", response={200: BattlePage, 404: Error, **ERRORS}, tags=["battles"])
def battles(
    request: HttpRequest,
    cursor: str | None = Query(None, pattern=r"^[A-Za-z0-9_-]{1,32}$", description="next_cursor of a page."),
    limit: int = Query(100, ge=1, le=1000),
) -> Any:
    """Ended battles (the models are revealed) with full conversations, ratings and verdicts."""
    require_key(request)
    try:
        page, next_cursor = research.ended_battles_page(cursor, limit)
    except Battle.DoesNotExist:
        raise HttpError(404, "cursor: no such battle (use next_cursor from an earlier page).") from None
    return {"battles": [selectors.research_battle(battle) for battle in page], "next_cursor": next_cursor}


@api.get("/battles/{battle_id}", response={200: dict[str, Any], 404: Error, **ERRORS}, tags=["battles"])
def battle(request: HttpRequest, battle_id: str) -> Any:
    require_key(request)
    found_battle = research.ended_battle(battle_id)
    if found_battle is None:
        raise HttpError(404, "No such ended battle.")
    return selectors.research_battle(found_battle)


# --- Evaluation runs ----------------------------------------------------------------------------------


class EvaluationSummary(Schema):
    id: int
    task: str
    status: str
    models: list[str]
    created: datetime


@api.get("/evaluations", response={200: list[EvaluationSummary], **ERRORS}, tags=["evaluations"])
def evaluations(request: HttpRequest) -> Any:
    researcher(request)
    runs = selectors.recent_evaluation_runs(200)
    return [
        {
            "id": run.pk,
            "task": run.task.slug,
            "status": run.status,
            "models": [m.name for m in run.llms.all()],
            "created": run.created,
        }
        for run in runs
    ]


@api.get("/evaluations/{run_id}", response={200: dict[str, Any], 404: Error, **ERRORS}, tags=["evaluations"])
def evaluation(request: HttpRequest, run_id: int) -> Any:
    """A run's three tables (reliability, dialog, fixing) and its recap, with every reply.

    The texts of models still in the arena (enabled on the roster) are withheld, with or without
    a researcher key: a reply's ``reply`` and ``reason`` (which quotes it), and any ``prompt``
    written from such a reason, are null and ``text_hidden`` is true; ``texts_hidden_for`` names
    those models. Verdicts, ratings and counts stay. A logged-in staff session sees every text,
    and everyone does once the model leaves the roster. Why: live battles are offered the same
    prompts, so published replies would let a voter name a battle's models before voting."""
    researcher(request)
    run = selectors.evaluation_run(run_id)
    if run is None:
        raise HttpError(404, "No such evaluation run.")
    return selectors.research_evaluation(run, reveal_texts=request.user.is_staff)


# --- Dumps -----------------------------------------------------------------------------------------


class DumpFile(Schema):
    name: str
    bytes: int


@api.get("/dumps", response={200: list[DumpFile], **ERRORS}, tags=["dumps"])
def dumps(request: HttpRequest) -> Any:
    """The files written by export_dump (nightly by beat), newest first."""
    researcher(request)
    files = dump_store.dump_files(Path(settings.ARENA_DUMP_DIR))
    return [{"name": f"{p.parent.name}/{p.name}", "bytes": p.stat().st_size} for p in files]


@api.get(
    "/dumps/{day}/{name}",
    response={200: None, 404: Error, **ERRORS},
    tags=["dumps"],
    openapi_extra={"responses": {200: {"description": "The file.", "content": {"application/octet-stream": {}}}}},
)
def dump_file(request: HttpRequest, day: str, name: str) -> Any:
    require_key(request)
    path = dump_store.dump_file(Path(settings.ARENA_DUMP_DIR), day, name)
    if path is None:
        raise HttpError(404, "No such dump file.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name)
