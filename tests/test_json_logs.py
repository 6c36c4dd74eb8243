"""LOG_FORMAT=json: every log record is one JSON object a line (a log collector's input), in the
web process's Django and in a Celery worker (which would otherwise put its own text format on the
root logger); plain text stays the default."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from votes.testing.stack import Stack, database_url

ROOT = Path(__file__).resolve().parent.parent
LOG_SOME = """
import logging, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "arena_site.settings")
import django
django.setup()
logging.getLogger("arena.test").warning("reply %s failed", 7, extra={"cause": "too_long"})
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("arena.test").exception("it broke")
"""


def run_logging(log_format: str | None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": "test-only", "ARENA_VAR_DIR": settings.VAR_DIR.as_posix()}
    if log_format is not None:
        env["LOG_FORMAT"] = log_format
    done = subprocess.run(
        [sys.executable, "-c", LOG_SOME], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_json_logs_are_one_object_a_line() -> None:
    lines = run_logging("json")
    records = [json.loads(line) for line in lines]  # Every line parses: a traceback included.
    assert len(records) == 2
    warning, error = records
    assert warning["level"] == "WARNING" and warning["logger"] == "arena.test"
    assert warning["message"] == "reply 7 failed" and warning["cause"] == "too_long"
    assert warning["time"].endswith("+00:00")
    assert error["level"] == "ERROR" and "ZeroDivisionError" in error["exc_info"]


def test_plain_text_is_the_default() -> None:
    lines = run_logging(None)
    assert lines[0] == "reply 7 failed"
    assert any("Traceback" in line for line in lines)


def test_an_unknown_log_format_is_refused() -> None:
    env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": "test-only", "LOG_FORMAT": "xml"}
    done = subprocess.run(
        [sys.executable, "-c", LOG_SOME], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "LOG_FORMAT" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_logs_json(tmp_path: Path, run_id: str) -> None:
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        env={"LOG_FORMAT": "json"},
    )
    try:
        worker = stack.start_worker(f"json-{run_id}", [f"test-{run_id}.json-logs"], concurrency=1)
    finally:
        stack.stop()
    records = [json.loads(line) for line in worker.log.read_text().splitlines() if line.startswith("{")]
    ready = [r for r in records if r["message"].endswith(" ready.")]
    assert ready and ready[0]["logger"].startswith("celery")
    # Celery's own records (its start-up, its shutdown) all went through the JSON formatter.
    assert not [line for line in worker.log.read_text().splitlines() if line.startswith("[20")]
