"""The research API's votes, fix episodes, battles, models and tasks (mounted by arena_site.api at
/api/v1; the key and throttles: arena_site.api_common)."""

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError

from arena_site.api_common import ERRORS, KEY_REQUIRED, Error, researcher_key
from inference import readiness
from inference.models import LLM
from votes import research, selectors
from votes.models import Battle, Task

router = Router()


# --- Models, tasks -------------------------------------------------------------------------------


class ModelOut(Schema):
    name: str
    family: str
    enabled: bool
    ready: bool = Field(description="Loaded and warm on a live host: battles draw it, voters can pick it.")
    state: Literal["unknown", "loading", "ready", "failed"] = Field(
        description="What its host last reported: unknown (no live host has reported it), loading, ready or failed."
    )


@router.get("/models", response={200: list[ModelOut], **ERRORS}, tags=["models and tasks"])
def models(request: HttpRequest) -> Any:
    roster = list(LLM.objects.order_by("name"))
    states = readiness.states(model.name for model in roster)
    return [
        {
            "name": model.name,
            "family": model.family,
            "enabled": model.enabled,
            "ready": states[model.name].ready,
            "state": states[model.name].state.value,
        }
        for model in roster
    ]


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


@router.get("/tasks", response={200: list[TaskOut], **ERRORS}, tags=["models and tasks"])
def tasks(request: HttpRequest) -> Any:
    """The active tasks, with their scripted turns and expected outputs."""
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


@router.get("/votes", response={200: None, **ERRORS}, tags=["votes"], openapi_extra=STREAM_DOC)
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
    key = researcher_key(request)
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


@router.get("/episodes", auth=KEY_REQUIRED, response={200: EpisodePage, **ERRORS}, tags=["votes"])
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
    page = research.episode_records(include_excluded=include_excluded, after=cursor or 0, limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return {"episodes": page, "next_cursor": page[-1]["episode_id"] if more else None}


class BattlePage(Schema):
    battles: list[dict[str, Any]]
    next_cursor: str | None


@router.get("/battles", auth=KEY_REQUIRED, response={200: BattlePage, 404: Error, **ERRORS}, tags=["battles"])
def battles(
    request: HttpRequest,
    cursor: str | None = Query(None, pattern=r"^[A-Za-z0-9_-]{1,32}$", description="next_cursor of a page."),
    limit: int = Query(100, ge=1, le=1000),
) -> Any:
    """Ended battles (the models are revealed) with full conversations, ratings and verdicts."""
    try:
        page, next_cursor = research.ended_battles_page(cursor, limit)
    except Battle.DoesNotExist:
        raise HttpError(404, "cursor: no such battle (use next_cursor from an earlier page).") from None
    return {"battles": [selectors.research_battle(battle) for battle in page], "next_cursor": next_cursor}


@router.get(
    "/battles/{battle_id}", auth=KEY_REQUIRED, response={200: dict[str, Any], 404: Error, **ERRORS}, tags=["battles"]
)
def battle(request: HttpRequest, battle_id: str) -> Any:
    found_battle = research.ended_battle(battle_id)
    if found_battle is None:
        raise HttpError(404, "No such ended battle.")
    return selectors.research_battle(found_battle)
