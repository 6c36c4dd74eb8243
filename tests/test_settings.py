"""Settings come from the environment; production settings pass Django's deploy checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    unset = {"DATABASE_URL", "REDIS_URL", "DEBUG", "HTTPS", "SECRET_KEY"}
    base = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "arena_site.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


SHOW_SETTINGS = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps({
    "engine": settings.DATABASES["default"]["ENGINE"],
    "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"],
    "backend": settings.GENERATION_BACKEND,
    "broker": settings.CELERY_BROKER_URL,
    "debug": settings.DEBUG,
    "hosts": settings.ALLOWED_HOSTS,
    "hsts_preload": settings.SECURE_HSTS_PRELOAD,
    "hsts_seconds": settings.SECURE_HSTS_SECONDS,
    "dtypes": [settings.ARENA_ENGINE_CACHE_DTYPE, settings.ARENA_ENGINE_EMBEDDING_DTYPE],
}))
"""


def test_embedded_defaults(tmp_path: Path) -> None:
    result = run_python(SHOW_SETTINGS, ARENA_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown == {
        "engine": "django.db.backends.sqlite3",
        "layer": "channels.layers.InMemoryChannelLayer",
        "backend": "in-process",
        "broker": "memory://",
        "debug": False,
        "hosts": ["127.0.0.1", "localhost"],
        "hsts_preload": False,
        "hsts_seconds": 0,
        "dtypes": ["float16", "bfloat16"],  # A laptop's: keys, values and embeddings kept narrow.
    }
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


def test_production_services_from_env() -> None:
    result = run_python(
        SHOW_SETTINGS,
        DATABASE_URL="postgres://arena@db:5432/arena",
        REDIS_URL="redis://cache:6379/0",
        ALLOWED_HOSTS="arena.example.org",
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["engine"] == "django.db.backends.postgresql"
    assert shown["layer"] == "arena_site.channel_layer.PumpedRedisChannelLayer"
    assert shown["backend"] == "celery"
    assert shown["broker"] == "redis://cache:6379/0"
    assert shown["hosts"] == ["arena.example.org"]
    assert shown["dtypes"] == ["", ""]  # An inference host's engines keep the models' own.


def test_an_unknown_engine_dtype_is_refused_with_its_name(tmp_path: Path) -> None:
    result = run_python(SHOW_SETTINGS, ARENA_VAR_DIR=str(tmp_path), ARENA_ENGINE_EMBEDDING_DTYPE="int8")
    assert result.returncode != 0
    assert "ARENA_ENGINE_EMBEDDING_DTYPE: 'int8' is none of float32, bfloat16, float16 or empty." in result.stderr


def test_hsts_preload_is_opt_in(tmp_path: Path) -> None:
    """HTTPS=1 sends HSTS for a year, but asks for the browsers' preload list only when told."""
    shown = [
        json.loads(run_python(SHOW_SETTINGS, ARENA_VAR_DIR=str(tmp_path), HTTPS="1", **extra).stdout)
        for extra in ({}, {"SECURE_HSTS_PRELOAD": "1"})
    ]
    assert [(s["hsts_seconds"], s["hsts_preload"]) for s in shown] == [(31536000, False), (31536000, True)]


def test_weak_admin_passwords_are_refused() -> None:
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    for weak in ("a", "password1234", "123456789012"):  # Too short, too common, all digits.
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password("calendar-tennis-Nov11-5pm")


def test_deploy_checks_are_clean_with_production_variables() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={
            **os.environ,
            "SECRET_KEY": "prod-" + "k3y-" * 16,
            "DEBUG": "0",
            "HTTPS": "1",
            "ALLOWED_HOSTS": "arena.example.org",
            "CSRF_TRUSTED_ORIGINS": "https://arena.example.org",
            "DATABASE_URL": "postgres://arena@db:5432/arena",
            "REDIS_URL": "redis://cache:6379/0",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_web_tier_never_imports_keras_jax_or_tensorflow(tmp_path: Path) -> None:
    code = (
        "import django, sys; django.setup();"
        "from django.core.management import call_command; call_command('migrate', verbosity=0);"
        "import arena_site.asgi, arena_site.urls, votes.consumers, votes.dispatch, leaderboard.views;"
        "from django.test import Client; Client().get('/'); Client().get('/leaderboard/');"
        "print(sorted(m for m in ('keras', 'keras_hub', 'jax', 'tensorflow') if m in sys.modules))"
    )
    result = run_python(code, ALLOWED_HOSTS="testserver", ARENA_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
