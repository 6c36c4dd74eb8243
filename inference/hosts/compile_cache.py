"""Compiled programs kept on disk: a host that starts again loads what it compiled before.

Plain module (no Django). An engine compiles one XLA program per prefill bucket and decode window
(``inference.engine``); on a CPU that is most of a model's start (the tiny test model's warm-up
took 25.9 s compiling and 5.3 s reading the same programs back). JAX's persistent compilation
cache keeps each program in a folder, keyed by the program, the compiler options, the JAX
version and the device, so a restarted host, a second worker process serving the same model,
or the same model loaded again after it was dropped, skips the compiler.

``ARENA_COMPILE_CACHE_DIR`` names the folder (default ``var/jax-cache`` in the project; empty:
no cache). JAX's own ``JAX_COMPILATION_CACHE_DIR``, when set, wins. Every program is kept, not
only those that took over a second to compile (JAX's default): an engine's programs are many
and each compiles in well under a second on a small model. The setting takes effect only before
the process's first compilation, which is why ``inference.hosts.engines`` and
``inference.streaming`` call :func:`enable` before they load a model.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "var" / "jax-cache"

_lock = threading.Lock()
_enabled: str | None = None


def cache_dir() -> str | None:
    """The folder compiled programs are kept in, from the environment; None: no cache."""
    own = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return own or os.environ.get("ARENA_COMPILE_CACHE_DIR", str(DEFAULT_DIR)) or None


def enable() -> str | None:
    """Point JAX's persistent compilation cache at :func:`cache_dir` (once per process); the
    folder, or None when the cache is off."""
    global _enabled
    with _lock:
        if _enabled is not None:
            return _enabled
        directory = cache_dir()
        if directory is None:
            return None
        import jax

        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        _enabled = directory
        return directory
