"""Sessions are created only where a voter needs one (the arena pages, whose websocket is tied
to it), and expired ones are purged nightly by beat."""

from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from votes.tasks import purge_expired_sessions

pytestmark = pytest.mark.django_db


def test_cookieless_gets_create_no_session_except_the_arena_pages(client) -> None:
    for path in (
        "/battle/AAAAAAAAAAAAAAAAAAAAAA/",  # Another browser's (or nobody's) battle: a 404.
        "/no-such-page/",
        "/leaderboard/",
        "/evaluations/",
        "/api/v1/models",
        "/healthz",
    ):
        client.cookies.clear()
        response = client.get(path)
        assert response.status_code in (200, 404, 429), path  # 429: the API's throttle, spent by other tests.
        assert not Session.objects.exists(), path
    client.cookies.clear()
    assert client.get("/").status_code == 200
    assert Session.objects.count() == 1  # The arena page: its websocket needs the session.


def test_beat_purges_expired_sessions_nightly(settings) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["purge-expired-sessions"]
    assert entry["task"] == purge_expired_sessions.name
    live, expired = SessionStore(), SessionStore()
    live.create()
    expired.create()
    Session.objects.filter(session_key=expired.session_key).update(expire_date=timezone.now() - timedelta(seconds=1))
    purge_expired_sessions()
    assert list(Session.objects.values_list("session_key", flat=True)) == [live.session_key]
