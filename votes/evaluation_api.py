"""The research API's evaluation runs (mounted by arena_site.api at /api/v1/evaluations)."""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError

from arena_site.api_common import ERRORS, Error
from votes import selectors

router = Router()


class EvaluationSummary(Schema):
    id: int
    task: str
    status: str
    models: list[str]
    created: datetime


@router.get("", response={200: list[EvaluationSummary], **ERRORS}, tags=["evaluations"])
def evaluations(request: HttpRequest) -> Any:
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


@router.get("/{run_id}", response={200: dict[str, Any], 404: Error, **ERRORS}, tags=["evaluations"])
def evaluation(request: HttpRequest, run_id: int) -> Any:
    """A run's three tables (reliability, dialog, fixing) and its recap, with every reply.

    The texts of models still in the arena (enabled on the roster) are withheld, with or without
    a researcher key: a reply's ``reply`` and ``reason`` (which quotes it), and any ``prompt``
    written from such a reason, are null and ``text_hidden`` is true; ``texts_hidden_for`` names
    those models. Verdicts, ratings and counts stay. A logged-in staff session sees every text,
    and everyone does once the model leaves the roster. Why: live battles are offered the same
    prompts, so published replies would let a voter name a battle's models before voting."""
    run = selectors.evaluation_run(run_id)
    if run is None:
        raise HttpError(404, "No such evaluation run.")
    return selectors.research_evaluation(run, reveal_texts=request.user.is_staff)
