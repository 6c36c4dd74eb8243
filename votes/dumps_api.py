"""The research API's dumps, the files export_dump writes (mounted by arena_site.api at
/api/v1/dumps)."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import FileResponse, HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError

from arena_site.api_common import ERRORS, KEY_REQUIRED, Error
from votes import dumps as dump_store

router = Router()


class DumpFile(Schema):
    name: str
    bytes: int


@router.get("", response={200: list[DumpFile], **ERRORS}, tags=["dumps"])
def dumps(request: HttpRequest) -> Any:
    """The files written by export_dump (nightly by beat), newest first."""
    files = dump_store.dump_files(Path(settings.ARENA_DUMP_DIR))
    return [{"name": f"{p.parent.name}/{p.name}", "bytes": p.stat().st_size} for p in files]


@router.get(
    "/{day}/{name}",
    auth=KEY_REQUIRED,
    response={200: None, 404: Error, **ERRORS},
    tags=["dumps"],
    openapi_extra={"responses": {200: {"description": "The file.", "content": {"application/octet-stream": {}}}}},
)
def dump_file(request: HttpRequest, day: str, name: str) -> Any:
    path = dump_store.dump_file(Path(settings.ARENA_DUMP_DIR), day, name)
    if path is None:
        raise HttpError(404, "No such dump file.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name)
