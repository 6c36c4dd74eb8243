"""The research API (django-ninja) at /api/v1: leaderboard, models, tasks, votes, battles,
evaluation runs and dumps. OpenAPI schema at /api/v1/openapi.json, docs at /api/v1/docs (Swagger
UI, served from django-ninja's own static files).

Without a key: the leaderboard, models, tasks, evaluations and a throttled sample of the newest
votes. With a researcher key (header ``X-API-Key``, issued in the admin): everything, paginated
by cursor, throttled per key.
"""

# This module builds the API and mounts the routers of the apps they serve (votes/api.py: votes,
# episodes, battles, models and tasks; leaderboard/api.py; votes/evaluation_api.py;
# votes/dumps_api.py); what they share (errors, the key, the throttles) is in api_common.

import math
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import Throttled, ValidationError
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation
from ninja.types import DictStrAny

from arena_site.api_common import KEY_OR_ANONYMOUS, THROTTLES, anonymous, per_minute
from leaderboard.api import router as leaderboard_router
from votes.api import router as votes_router
from votes.dumps_api import router as dumps_router
from votes.evaluation_api import router as evaluation_router

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds until one more request fits the budget.",
        "schema": {"type": "integer", "minimum": 1},
    }
}


class ResearchSchema(OpenAPISchema):
    """ninja's OpenAPI document, plus: an operation that takes a key or none says so (``{}``
    among its security requirements: the key is optional), and a 429 names its Retry-After."""

    def operation_security(self, operation: Operation) -> list[DictStrAny] | None:
        security = super().operation_security(operation)
        if security and anonymous in operation.auth_callbacks:
            security.append({})
        return security

    def operation_details(self, operation: Operation) -> DictStrAny:
        details = super().operation_details(operation)
        throttled = details["responses"].get(429)
        if throttled is not None:
            throttled["headers"] = RETRY_AFTER
        return details


class ResearchAPI(NinjaAPI):
    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: DictStrAny | None = None
    ) -> OpenAPISchema:
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        return ResearchSchema(self, path_prefix)

    def get_openapi_operation_id(self, operation: Operation) -> str:
        # As when every operation was in this module: clients generated from the schema keep
        # their method names.
        return f"arena_site_api_{operation.view_func.__name__}"


api = ResearchAPI(
    title="Fix Arena research API",
    version="1",
    description=__doc__ or "",
    urls_namespace="api-1",
    auth=KEY_OR_ANONYMOUS,  # Operations that need a key say so (api_common.KEY_REQUIRED).
    throttle=THROTTLES,
)
api.add_router("", votes_router)
api.add_router("/leaderboard", leaderboard_router)
api.add_router("/evaluations", evaluation_router)
api.add_router("/dumps", dumps_router)


@api.exception_handler(ValidationError)
def invalid_request(request: HttpRequest, exc: ValidationError) -> Any:
    messages = "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', [])[1:]) or 'request'}: {error.get('msg')}"
        for error in exc.errors
    )
    return api.create_response(request, {"detail": messages or "Invalid request."}, status=422)


@api.exception_handler(Throttled)
def throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
    wait = max(1, math.ceil(exc.wait or 60))
    response = api.create_response(
        request,
        {"detail": f"Too many requests: at most {per_minute(request)} a minute; retry in {wait} s."},
        status=429,
    )
    response["Retry-After"] = str(wait)
    return response
