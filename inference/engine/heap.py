"""Handing the C heap's free pages back to the system (glibc's ``malloc_trim``).

XLA's compilations and a model's loading free much of what they allocate, and glibc keeps it
resident. The engine hands it back after each compilation of its warm-up (``Engine.warm_up``), so
the process peaks lower while it warms (SmolLM2 serving its fixer, ``bench_engine --memory``:
3,887 MiB at its peak against 5,142 MiB handing it back only once warm); a model host after
loading and warming each model (``inference.hosts.engines``).
"""

from __future__ import annotations

import contextlib
import ctypes


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (a few milliseconds; nothing where the C
    library is not glibc)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
