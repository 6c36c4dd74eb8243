"""inference.hosts.compile_cache: a process that compiles what another compiled before reads it
from the folder instead of compiling it again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from inference.hosts import compile_cache

# Enables the cache as a host does (before its first compilation), compiles one program, and says
# whether JAX found it in the persistent cache.
PROGRAM = """
import json
import jax
import jax.monitoring
from inference.hosts import compile_cache
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
folder = compile_cache.enable()
jax.jit(lambda x: (x * 3.0 + 1.0).sum())(jax.numpy.arange(17.0)).block_until_ready()
print(json.dumps({"folder": folder, "hit": "/jax/compilation_cache/cache_hits" in hits}))
"""


def compile_once(environ: dict[str, str]) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JAX_COMPILATION", "JAX_PERSISTENT"))}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env={**env, "JAX_PLATFORMS": "cpu", **environ},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_the_program_the_first_compiled(tmp_path: Path) -> None:
    folder = tmp_path / "compiled"
    first = compile_once({"ARENA_COMPILE_CACHE_DIR": str(folder)})
    assert first == {"folder": str(folder), "hit": False}
    assert any(folder.iterdir())  # Kept, though it compiled in far less than JAX's default second.
    assert compile_once({"ARENA_COMPILE_CACHE_DIR": str(folder)}) == {"folder": str(folder), "hit": True}


def test_an_empty_setting_turns_the_cache_off(tmp_path: Path) -> None:
    assert compile_once({"ARENA_COMPILE_CACHE_DIR": ""}) == {"folder": None, "hit": False}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, str(compile_cache.DEFAULT_DIR)),
        ({"ARENA_COMPILE_CACHE_DIR": "/srv/compiled"}, "/srv/compiled"),
        ({"ARENA_COMPILE_CACHE_DIR": ""}, None),
        ({"ARENA_COMPILE_CACHE_DIR": "/srv/compiled", "JAX_COMPILATION_CACHE_DIR": "/srv/jax"}, "/srv/jax"),
    ],
)
def test_the_folder_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: str | None
) -> None:
    for key in ("ARENA_COMPILE_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert compile_cache.cache_dir() == expected
