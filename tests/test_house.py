"""The house: what may import what (pyproject.toml's [tool.importlinter] contracts).

A model host (``inference.hosts``, the engine, forward passes, clients) runs without Django, a
database or the arena's apps; ``votes`` and ``leaderboard`` reach the models only through the
roster (``inference.models``, ``inference.selectors``, ``inference.services``)."""

import subprocess
import sys
from pathlib import Path

from django.conf import settings

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_the_import_contracts_hold() -> None:
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_a_host_process_runs_without_django_or_the_arenas_apps() -> None:
    """What ``python -m inference.hosts.openai_server`` imports, in a fresh interpreter: the server,
    the engines it loads models into, the engine itself and both clients."""
    code = (
        "import sys, inference.hosts.openai_server, inference.hosts.engines, inference.engine, "
        "inference.clients.local, inference.clients.openai_compatible; "
        "print(sorted(m for m in ('django', 'votes', 'leaderboard', 'arena_site', 'celery', 'channels') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
