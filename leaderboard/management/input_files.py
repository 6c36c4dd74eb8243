"""Reading the input file of the leaderboard's commands (rate_battles, rate_fixes)."""

import sys
from pathlib import Path

from django.core.management.base import CommandError


def read_input(name: str) -> str:
    """The file's text, or stdin's for ``-``; a clear CommandError when it cannot be read."""
    try:
        return sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as error:
        raise CommandError(f"Cannot read {name}: {error.strerror}.") from None
